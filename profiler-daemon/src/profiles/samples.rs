//! A sample's frames and labels as the profiles show them: resolved stacks
//! cut at their root or marked `[truncated]`/`[lost ...]`, with a CPython
//! thread's Python frames in place of the evaluator's, and the pid, tid,
//! thread, lock and condition labels.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use profiler_common::PyFrames;

use crate::bpf::drain::{SampleId, Stack};
use crate::config::Settings;
use crate::model::frames::{Frame, Line, PyLoc};
use crate::procs::process::ProcessTable;
use crate::stacks::symbolize::Symbolizer;
use crate::stacks::symbolize::python::PythonCodes;

pub(crate) fn push_stack(
    frames: &mut Vec<Frame>,
    stack: &Stack,
    what: &str,
    resolve: impl FnOnce(&[u64], [u64; 2]) -> Vec<Frame>,
) {
    match stack {
        Stack::Frames(ips) => frames.extend(resolve(ips, [0; 2])),
        // Visible at the root end rather than silently shorter.
        Stack::Truncated(ips) => {
            frames.extend(resolve(ips, [0; 2]));
            frames.push(marker_frame("[truncated]".to_string()));
        }
        Stack::FramePointer(ips, leaf_words) => {
            let mut resolved = resolve(ips, *leaf_words);
            // Cut what follows the entry point (a frame-pointer walk runs on
            // through garbage when the entry code keeps no frame pointer);
            // without an entry point the walk broke off early: say so.
            match resolved.iter().position(is_stack_root) {
                Some(root) => resolved.truncate(root + 1),
                None => resolved.push(marker_frame("[truncated]".to_string())),
            }
            frames.extend(resolved);
        }
        Stack::None => {}
        // Visible rather than silently shorter: the sample still counts.
        Stack::Lost => frames.push(marker_frame(format!("[lost {what} stack]"))),
    }
}

/// A sample's Python frames, leaf first (None: not a Python sample).
pub(crate) type PythonFrames = Option<Arc<[PyLoc]>>;

/// Python samples whose frames went past `PY_FRAMES_MAX` (those nearest
/// the root are missing), for the exit summary.
pub(crate) static PYTHON_STACKS_TRUNCATED: AtomicU64 = AtomicU64::new(0);

/// The Python frames a sample of `tgid` carries, if any, settled while
/// the process lives (its code objects read).
pub(crate) fn python_frames<const N: usize>(
    codes: &mut PythonCodes,
    tgid: u32,
    python: &PyFrames<N>,
) -> PythonFrames {
    if python.truncated != 0 {
        PYTHON_STACKS_TRUNCATED.fetch_add(1, Ordering::Relaxed);
    }
    let len = (python.len as usize).min(N);
    (len > 0).then(|| codes.settle(tgid, &python.frames[..len]))
}

/// The user frames of sample `id` walked as `ips`: the native walk, with
/// the sample's Python frames (if any) in place of the evaluator's calls.
pub(crate) fn user_frames(
    symbolizer: &mut Symbolizer,
    procs: &mut ProcessTable,
    id: &SampleId,
    ips: &[u64],
    leaf_words: [u64; 2],
) -> Vec<Frame> {
    let native = symbolizer.user_walk_of(
        procs,
        (id.tgid, id.generation),
        ips,
        leaf_words,
        id.jit_time(),
    );
    match &id.python {
        Some(python) => {
            let segments = symbolizer.python.segments(python);
            symbolizer.python.interleave(native, segments)
        }
        None => native,
    }
}

/// Notes the user stack of `id` for the symbolizer to look up with the
/// rest of a window's, object by object (`Symbolizer::prefetch_user`).
pub(crate) fn prefetch_user_stack(
    symbolizer: &mut Symbolizer,
    procs: &mut ProcessTable,
    id: &SampleId,
) {
    let image = (id.tgid, id.generation);
    match &id.user {
        Stack::Frames(ips) | Stack::Truncated(ips) => {
            symbolizer.prefetch_user(procs, image, ips, [0; 2])
        }
        Stack::FramePointer(ips, leaf_words) => {
            symbolizer.prefetch_user(procs, image, ips, *leaf_words)
        }
        Stack::None | Stack::Lost => {}
    }
}

/// Functions at which a thread's stack begins: a complete walk ends here.
pub(crate) fn is_stack_root(frame: &Frame) -> bool {
    const ROOTS: [&str; 8] = [
        "_start",
        "__libc_start_call_main",
        "__libc_start_main",
        "start_thread",
        "clone",
        "clone3",
        "__clone",
        "thread_start",
    ];
    // Go: goroutines start at runtime.goexit, system threads at mstart;
    // what runs under runtime.mcall is the scheduler's work on the
    // thread's own stack, not the goroutine's that called it (a
    // frame-pointer walk would run on into that goroutine's frames, and
    // charge it, say, an idle thread's sleep). Go's profiles end such
    // stacks at runtime.mcall too.
    const GO_ROOTS: [&str; 4] = [
        "runtime.goexit",
        "runtime.mstart",
        "runtime.rt0_go",
        "runtime.mcall",
    ];
    frame.lines.last().is_some_and(|line| {
        let name = line.function.as_str();
        ROOTS.iter().any(|r| {
            name == *r
                || name
                    .strip_prefix(r)
                    .is_some_and(|rest| rest.starts_with('@'))
        }) || name.starts_with("__libc_start_main")
            || name.ends_with("_clone3")
            || name.ends_with("_clone")
            || GO_ROOTS.iter().any(|r| name.starts_with(r))
    })
}

/// Kernel frames of the tracing machinery that ran the probe.
pub(crate) fn is_tracing_frame(frame: &Frame) -> bool {
    frame.lines.last().is_some_and(|line| {
        let name = line.function.as_str();
        name.starts_with("__traceiter_")
            || name.starts_with("__bpf_trace_")
            || name.starts_with("bpf_trace_run")
            || name.starts_with("trace_call_bpf")
            || name.starts_with("bpf_prog_")
    })
}

/// A frame that names a condition rather than code.
pub(crate) fn marker_frame(function: String) -> Frame {
    Frame {
        address: 0,
        mapping: None,
        lines: Arc::from(vec![Line {
            function,
            file: None,
            line: 0,
        }]),
    }
}

pub(crate) fn sample_labels(
    settings: &Settings,
    procs: &ProcessTable,
    id: &SampleId,
) -> Vec<(String, String)> {
    let comm = procs
        .get_image(id.tgid, id.generation)
        .map(|p| p.comm.clone())
        // Empty for an image placed from anchors: its name was never read.
        .filter(|comm| !comm.is_empty())
        .unwrap_or_else(|| {
            if id.tgid == id.tid {
                id.thread_name()
            } else {
                String::new()
            }
        });
    let mut labels = vec![
        ("pid".to_string(), id.tgid.to_string()),
        ("tid".to_string(), id.tid.to_string()),
        ("comm".to_string(), comm),
        ("thread".to_string(), id.thread_name()),
    ];
    if id.object != 0 {
        // Which lock or condition: the futex word's address (a mutex's own
        // address; inside a condition variable).
        labels.push(("lock".to_string(), format!("{:#x}", id.object)));
    }
    if id.cond != 0 {
        // The pthread_cond_t itself, which the futex word lies in.
        labels.push(("cond".to_string(), format!("{:#x}", id.cond)));
    }
    labels.extend(
        procs
            .image_labels(id.tgid, id.generation)
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    labels.extend(settings.labels.iter().cloned());
    labels
}

/// Drops the runtime's own frames at the leaf end of a stack recorded
/// inside Go's runtime (its allocator and profiler, its semaphores), as
/// Go's own profiles do (`runtime/pprof`'s `writeHeapProto`): up to the
/// first frame that is not all `runtime.` functions; a stack of nothing
/// else keeps them all.
pub(crate) fn hide_go_runtime(frames: &mut Vec<Frame>) {
    let is_runtime = |frame: &Frame| {
        !frame.lines.is_empty()
            && frame
                .lines
                .iter()
                .all(|line| line.function.starts_with("runtime."))
    };
    if let Some(first) = frames.iter().position(|f| !is_runtime(f)) {
        frames.drain(..first);
    }
}

/// Drops, at the leaf end of a goroutine's release of a sync.Mutex or
/// sync.RWMutex waiter, the sync package's own release path (its
/// semaphore call, the slow unlock, and from Go 1.24 the `internal/sync`
/// mutex's unlock), inlined lines included, so that the sample starts
/// where Go's mutex profile starts it: at the method the program called
/// (`sync.(*Mutex).Unlock`), or at the caller of internal/sync's mutex
/// (`internal/sync.(*HashTrieMap).Swap` under a `sync.Map`).
pub(crate) fn hide_sync_release(frames: &mut Vec<Frame>) {
    // internal/sync's mutex is skipped where Go skips it, under its
    // callers: sync.Mutex's (whose frame shows) and the others in
    // internal/sync (a sync.Map's HashTrieMap), which Go's profile shows.
    let internal = |line: &Line| {
        let name = line.function.as_str();
        name.starts_with("internal/sync.runtime_")
            || name == "internal/sync.(*Mutex).Unlock"
            || name.starts_with("sync.runtime_")
            || name.ends_with(").unlockSlow")
            || name.ends_with(").rUnlockSlow")
    };
    drop_leading_lines(frames, internal);
}

/// Drops, at the leaf end of a goroutine's park, the frames Go's block
/// profile does not show: the runtime's park path (`gopark`, its
/// semaphore, condition and channel internals) and the sync package's
/// acquire path (its semaphore calls, the slow lock, from Go 1.24 the
/// `internal/sync` mutex under `sync.Mutex`), inlined lines included, so
/// that the sample starts where Go's does: at the exported sync method
/// (`sync.(*Mutex).Lock`, `sync.(*WaitGroup).Wait`, `sync.(*Cond).Wait`),
/// or at the runtime's channel entry the program called
/// (`runtime.chanrecv1`, `runtime.chansend1`, `runtime.selectgo`).
pub(crate) fn hide_go_park(frames: &mut Vec<Frame>) {
    const SHOWN: [&str; 4] = [
        "runtime.chanrecv1",
        "runtime.chanrecv2",
        "runtime.chansend1",
        "runtime.selectgo",
    ];
    let hidden = |line: &Line| {
        let name = line.function.as_str();
        (name.starts_with("runtime.") && !SHOWN.contains(&name))
            || name.starts_with("sync.runtime_")
            || name.starts_with("internal/sync.runtime_")
            || name == "internal/sync.(*Mutex).Lock"
            || name.ends_with(").lockSlow")
    };
    drop_leading_lines(frames, hidden);
}

/// Drops the leading lines (innermost first) for which `hidden` holds,
/// and the frames left with none.
fn drop_leading_lines(frames: &mut Vec<Frame>, hidden: impl Fn(&Line) -> bool) {
    while let Some(first) = frames.first() {
        let inner = first.lines.iter().take_while(|l| hidden(l)).count();
        if inner == 0 {
            break;
        }
        if inner == first.lines.len() {
            frames.remove(0);
            continue;
        }
        // Lines are innermost first: the frame keeps its callers' lines.
        let kept: Vec<Line> = first.lines[inner..].to_vec();
        frames[0].lines = Arc::from(kept);
        break;
    }
}

/// Drops the compiler's `defer` wrappers (`main.f.deferwrap1`, in which
/// a deferred `mu.Unlock()` is inlined from Go 1.22) from a goroutine's
/// stack, inlined lines included, as Go's own tracebacks elide them: a
/// release made by `defer mu.Unlock()` is charged to `sync.(*Mutex).Unlock
/// <- main.f`, as Go's mutex profile charges it.
pub(crate) fn hide_go_wrappers(frames: &mut Vec<Frame>) {
    let wrapper = |line: &Line| {
        line.function
            .rsplit_once(".deferwrap")
            .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    if !frames.iter().any(|f| f.lines.iter().any(wrapper)) {
        return;
    }
    frames.retain_mut(|frame| {
        if frame.lines.iter().any(wrapper) {
            let kept: Vec<Line> = frame
                .lines
                .iter()
                .filter(|l| !wrapper(l))
                .cloned()
                .collect();
            if kept.is_empty() {
                return false;
            }
            frame.lines = Arc::from(kept);
        }
        true
    });
}

/// Whether a goroutine's release (after [`hide_sync_release`]) starts at
/// an unlock Go's mutex profile counts: a sync.Mutex's or sync.RWMutex's,
/// not a sync.WaitGroup's, a poller's or the runtime's own semaphore.
pub(crate) fn is_go_mutex_release(frames: &[Frame]) -> bool {
    frames
        .first()
        .and_then(|f| f.lines.first())
        .is_some_and(|line| {
            matches!(
                line.function.as_str(),
                "sync.(*Mutex).Unlock" | "sync.(*RWMutex).Unlock" | "sync.(*RWMutex).RUnlock"
            )
        })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Each frame's functions, innermost first.
    fn names(frames: &[Frame]) -> Vec<Vec<String>> {
        frames
            .iter()
            .map(|f| f.lines.iter().map(|l| l.function.clone()).collect())
            .collect()
    }

    fn frame(names: &[&str]) -> Frame {
        Frame {
            address: 0x1000,
            mapping: None,
            lines: names
                .iter()
                .map(|n| Line {
                    function: n.to_string(),
                    file: None,
                    line: 0,
                })
                .collect::<Vec<_>>()
                .into(),
        }
    }

    #[test]
    fn stack_roots() {
        for root in [
            "_start",
            "__libc_start_call_main",
            "__libc_start_main_impl",
            "__libc_start_main@@GLIBC_2.34",
            "start_thread",
            "__GI___clone3",
            "runtime.goexit.abi0",
            "runtime.mstart",
            "runtime.mcall",
        ] {
            assert!(is_stack_root(&frame(&[root])), "{root}");
        }
        for other in [
            "main",
            "clone_this",
            "run",
            "_start_server",
            "runtime.park_m",
        ] {
            assert!(!is_stack_root(&frame(&[other])), "{other}");
        }
        // The outermost of inlined lines decides.
        assert!(is_stack_root(&frame(&["inlined_helper", "start_thread"])));
        assert!(!is_stack_root(&frame(&[])));
    }

    #[test]
    fn a_goroutine_release_starts_at_the_exported_unlock() {
        // Go 1.27: the internal mutex inlined under sync's.
        let mut frames = vec![
            frame(&["internal/sync.runtime_Semrelease"]),
            frame(&["internal/sync.(*Mutex).unlockSlow"]),
            frame(&[
                "internal/sync.(*Mutex).Unlock",
                "sync.(*Mutex).Unlock",
                "main.holdLock",
            ]),
            frame(&["main.main"]),
        ];
        hide_sync_release(&mut frames);
        assert_eq!(
            names(&frames),
            [
                vec!["sync.(*Mutex).Unlock", "main.holdLock"],
                vec!["main.main"]
            ]
        );
        // Go 1.19.
        let mut frames = vec![
            frame(&["sync.runtime_Semrelease"]),
            frame(&["sync.(*Mutex).unlockSlow"]),
            frame(&["sync.(*Mutex).Unlock", "main.holdLock"]),
        ];
        hide_sync_release(&mut frames);
        assert_eq!(
            names(&frames),
            [vec!["sync.(*Mutex).Unlock", "main.holdLock"]]
        );
        // Nothing of the sync package: unchanged.
        let mut frames = vec![frame(&["main.f"])];
        hide_sync_release(&mut frames);
        assert_eq!(names(&frames), [vec!["main.f"]]);
    }

    #[test]
    fn frame_pointer_stacks_are_cut_at_the_root_or_marked() {
        let walked = Stack::FramePointer(Arc::from(vec![1u64, 2, 3, 4]), [0; 2]);
        let mut out = Vec::new();
        push_stack(&mut out, &walked, "user", |_, _| {
            vec![
                frame(&["leaf"]),
                frame(&["main"]),
                frame(&["__libc_start_call_main"]),
                frame(&[]),
            ]
        });
        let names: Vec<_> = out
            .iter()
            .map(|f| f.lines.last().map(|l| l.function.clone()))
            .collect();
        assert_eq!(names.len(), 3, "garbage after the root is cut: {names:?}");
        let mut out = Vec::new();
        push_stack(&mut out, &walked, "user", |_, _| {
            vec![frame(&["leaf"]), frame(&[])]
        });
        assert_eq!(out.last().unwrap().lines[0].function, "[truncated]");
    }

    #[test]
    fn defer_wrappers_are_elided_as_go_elides_them() {
        // `defer mu.Unlock()`: Unlock inlined into the wrapper, its frame
        // kept with the wrapper's line gone; a wrapper alone goes.
        let mut frames = vec![
            frame(&["sync.(*Mutex).Unlock", "main.f.deferwrap1"]),
            frame(&["main.f.deferwrap2"]),
            frame(&["main.f"]),
            frame(&["main.deferwrap"]),
        ];
        hide_go_wrappers(&mut frames);
        assert_eq!(
            names(&frames),
            [
                vec!["sync.(*Mutex).Unlock"],
                vec!["main.f"],
                vec!["main.deferwrap"]
            ]
        );
    }
}
