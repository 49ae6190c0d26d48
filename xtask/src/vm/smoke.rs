//! The smoke: each profile type run system-wide for a few seconds in the VM
//! over a static workload that gives every type something to record, and
//! what profilerd did with it, read from its own log: whether it started
//! or refused (and why), whether it said it was ready, how many files and
//! samples it wrote; and beforehand what `profilerd --check` says of the
//! kernel.

use std::fmt::Write as _;

use crate::bench::harness::strip_ansi;

/// The profile types, in the order the smoke runs them.
pub const PROFILE_TYPES: &[&str] = &["cpu", "heap", "block", "mutex", "offcpu"];

/// The workload (in the VM's workloads directory): CPU, malloc/free and a
/// contended mutex at once.
const WORKLOAD: &str = "mixed";

/// The script the smoke runs: `profilerd --check`, then the workload in the
/// background and profilerd once per type, each between lines the host finds again,
/// writing into the current directory (the VM's /tmp, or a scratch
/// directory on the host).
pub fn script(seconds: u32) -> String {
    let mut s = String::from("#!/bin/sh\n");
    // What profilerd itself says this kernel offers each type.
    s.push_str("echo '@@check begin'\n");
    let _ = writeln!(
        s,
        "profilerd --check --profiles {} 2>&1",
        PROFILE_TYPES.join(",")
    );
    s.push_str("echo \"@@check end exit=$?\"\n");
    // Longer than every run together; killed at the end.
    let _ = writeln!(s, "{WORKLOAD} 3600 >/dev/null 2>&1 &\nload=$!");
    let _ = writeln!(s, "for type in {}; do", PROFILE_TYPES.join(" "));
    let _ = writeln!(s, "  echo \"@@smoke $type begin\"");
    let _ = writeln!(
        s,
        "  profilerd --profiles \"$type\" --duration {seconds}s --interval {seconds}s \
         --output-dir \"profiles-$type\" 2>&1"
    );
    s.push_str("  rc=$?\n");
    s.push_str("  files=$(ls \"profiles-$type\" 2>/dev/null | grep -c '\\.pb\\.gz$')\n");
    s.push_str("  echo \"@@smoke $type end exit=$rc files=$files\"\n");
    s.push_str("done\nkill $load\n");
    s
}

/// What `profilerd --check` printed before the runs, and its exit status
/// (None if its end never showed, or the script had no check).
pub fn parse_check(output: &str) -> Option<(String, Option<i32>)> {
    let mut lines = output.lines().map(|l| l.trim_end());
    lines.find(|l| *l == "@@check begin")?;
    let mut text = String::new();
    for line in lines {
        if let Some(rest) = line.strip_prefix("@@check end exit=") {
            return Some((text, rest.parse().ok()));
        }
        text.push_str(line);
        text.push('\n');
    }
    Some((text, None))
}

/// What one profile type did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TypeResult {
    pub profile: String,
    /// profilerd's exit status; None if its end never showed.
    pub exit: Option<i32>,
    /// It logged that every probe was attached.
    pub ready: bool,
    /// Profile files in its output directory.
    pub files: u32,
    /// Samples over every "wrote" line.
    pub samples: u64,
    /// Its one-line error (`profilerd: ...`), if it failed.
    pub error: Option<String>,
    /// Its first warning's message.
    pub warning: Option<String>,
}

impl TypeResult {
    /// One word for the table.
    pub fn verdict(&self) -> &'static str {
        match (self.exit, self.ready) {
            (None, _) => "no end",
            (Some(0), true) if self.samples > 0 => "works",
            (Some(0), true) => "empty",
            (Some(_), false) => "refused",
            (Some(_), true) => "failed",
        }
    }

    pub fn works(&self) -> bool {
        self.verdict() == "works"
    }
}

/// The state `profilerd --check` gave each profile type (its first word:
/// ready, degraded or unavailable), from the check's text.
pub fn check_states(check: &str) -> Vec<(String, String)> {
    check
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let (kind, state) = (words.next()?, words.next()?);
            PROFILE_TYPES
                .contains(&kind)
                .then(|| (kind.to_string(), state.to_string()))
        })
        .collect()
}

/// Where a run did not do what `--check` said it would: a type said ready
/// or degraded must write samples, one said unavailable must be refused
/// with its one-line reason. Empty when the check told the truth.
pub fn disagreements(results: &[TypeResult], states: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for kind in PROFILE_TYPES {
        let state = states
            .iter()
            .find(|(k, _)| k == kind)
            .map_or("(not in the check)", |(_, s)| s.as_str());
        let Some(result) = results.iter().find(|r| r.profile == *kind) else {
            out.push(format!("{kind}: never ran"));
            continue;
        };
        let agrees = match state {
            "ready" | "degraded" => result.works(),
            "unavailable" => result.verdict() == "refused" && result.error.is_some(),
            _ => false,
        };
        if !agrees {
            out.push(format!(
                "{kind}: --check said {state}, the run {}",
                result.verdict()
            ));
        }
    }
    out
}

/// Types `--check` called unavailable on a kernel of the matrix, where
/// every type works (6.1, 6.12 and the host's): a program the kernel
/// refuses is a regression there, though the run then agrees with the
/// check (Linux 6.1's verifier once refused `heap_probe`, and the smoke
/// passed).
pub fn unavailable(states: &[(String, String)]) -> Vec<String> {
    states
        .iter()
        .filter(|(kind, state)| PROFILE_TYPES.contains(&kind.as_str()) && state == "unavailable")
        .map(|(kind, _)| format!("{kind}: unavailable on a kernel where every type works"))
        .collect()
}

/// The results of every type found in the smoke's output, in run order.
pub fn parse(output: &str) -> Vec<TypeResult> {
    let mut results = Vec::new();
    let mut current: Option<TypeResult> = None;
    for raw in output.lines() {
        let line = strip_ansi(raw);
        let line = line.trim_end();
        if let Some(rest) = line.strip_prefix("@@smoke ") {
            let mut words = rest.split_whitespace();
            let (Some(profile), Some(what)) = (words.next(), words.next()) else {
                continue;
            };
            if what == "begin" {
                results.extend(current.take());
                current = Some(TypeResult {
                    profile: profile.to_string(),
                    ..TypeResult::default()
                });
            } else if what == "end"
                && let Some(mut result) = current.take()
            {
                for word in words {
                    if let Some(v) = word.strip_prefix("exit=") {
                        result.exit = v.parse().ok();
                    } else if let Some(v) = word.strip_prefix("files=") {
                        result.files = v.parse().unwrap_or(0);
                    }
                }
                results.push(result);
            }
            continue;
        }
        let Some(result) = current.as_mut() else {
            continue;
        };
        if let Some(error) = line.strip_prefix("profilerd: ") {
            result.error.get_or_insert_with(|| error.to_string());
        } else if let Some((level, message)) = log_message(line) {
            if message.starts_with("ready: every probe is attached") {
                result.ready = true;
            } else if let Some(n) = samples_written(message) {
                result.samples += n;
            } else if level == "WARN" || level == "ERROR" {
                result.warning.get_or_insert_with(|| message.to_string());
            }
        }
    }
    results.extend(current);
    results
}

/// The level and message of a daemon log line (`TIMESTAMP LEVEL target:
/// message`).
fn log_message(line: &str) -> Option<(&str, &str)> {
    let rest = line.trim_start();
    let (_timestamp, rest) = rest.split_once(' ')?;
    let rest = rest.trim_start();
    let (level, rest) = rest.split_once(' ')?;
    if !["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&level) {
        return None;
    }
    let (_target, message) = rest.trim_start().split_once(": ")?;
    Some((level, message))
}

/// N in the daemon's "wrote PATH (N samples, ...)".
fn samples_written(message: &str) -> Option<u64> {
    let rest = message.strip_prefix("wrote ")?;
    let (_, counts) = rest.rsplit_once(" (")?;
    counts.split_once(" samples")?.0.parse().ok()
}

/// The results as a Markdown table (pasted as is into the docs).
pub fn table(results: &[TypeResult]) -> String {
    let mut s = String::from(
        "| type | started | ready | files | samples | verdict | first error or warning |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for r in results {
        let started = match r.exit {
            Some(_) if r.ready => "yes",
            Some(0) => "yes",
            Some(_) => "refused",
            None => "?",
        };
        let note =
            short(r.error.as_deref().or(r.warning.as_deref()).unwrap_or("")).replace('|', "\\|");
        let _ = writeln!(
            s,
            "| {} | {started} | {} | {} | {} | {} | {note} |",
            r.profile,
            if r.ready { "yes" } else { "no" },
            r.files,
            r.samples,
            r.verdict(),
        );
    }
    s
}

/// An error or warning short enough for a table cell. A verifier log (one
/// line in profilerd's error) keeps what precedes it and its end, where the
/// verifier says why it refused; anything else is cut at 200 characters.
fn short(note: &str) -> String {
    const TAIL: usize = 110;
    if let Some((head, log)) = note.split_once(" Verifier output: ") {
        let log = log.split(" verification time").next().unwrap_or(log);
        let cut = log
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| log.len() - i <= TAIL)
            .unwrap_or(0);
        return format!("{head} Verifier: …{}", &log[cut..]);
    }
    match note.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &note[..i]),
        None => note.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUTPUT: &str = "\
@@smoke cpu begin
2026-01-01T00:00:00.000001Z  INFO profilerd::session: ready: every probe is attached
2026-01-01T00:00:03.000001Z  INFO profilerd::session: wrote /tmp/profiles-cpu/cpu-20260101T000000Z.pb.gz (412 samples, built in 3.1 ms, written in 0.4 ms)
@@smoke cpu end exit=0 files=1
@@smoke heap begin
2026-01-01T00:00:04.000001Z  WARN profilerd::heap: attaching allocator probes to /workloads/mixed failed: Invalid argument (os error 22)
2026-01-01T00:00:04.000002Z  INFO profilerd::session: ready: every probe is attached
\u{1b}[2m2026-01-01T00:00:07.000001Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m \u{1b}[2mprofilerd::session\u{1b}[0m\u{1b}[2m:\u{1b}[0m wrote /tmp/profiles-heap/heap-x.pb.gz (0 samples, built in 0.1 ms, written in 0.1 ms)
@@smoke heap end exit=0 files=1
@@smoke block begin
profilerd: loading sys_enter_futex_wait: sys_enter_futex_wait/id: No such file or directory
@@smoke block end exit=1 files=0
@@smoke offcpu begin
";

    #[test]
    fn reads_each_types_outcome() {
        let results = parse(OUTPUT);
        let verdicts: Vec<(&str, &str)> = results
            .iter()
            .map(|r| (r.profile.as_str(), r.verdict()))
            .collect();
        assert_eq!(
            verdicts,
            [
                ("cpu", "works"),
                ("heap", "empty"),
                ("block", "refused"),
                ("offcpu", "no end")
            ]
        );
        assert_eq!(results[0].samples, 412);
        assert_eq!(results[0].files, 1);
        assert!(results[1].ready);
        assert!(
            results[1]
                .warning
                .as_deref()
                .unwrap()
                .starts_with("attaching allocator probes")
        );
        assert_eq!(
            results[2].error.as_deref(),
            Some(
                "loading sys_enter_futex_wait: sys_enter_futex_wait/id: No such file or directory"
            )
        );
        assert_eq!(results[2].exit, Some(1));
    }

    #[test]
    fn table_has_a_row_per_type() {
        let table = table(&parse(OUTPUT));
        assert_eq!(table.lines().count(), 2 + 4);
        assert!(table.contains("| heap | yes | yes | 1 | 0 | empty | attaching allocator probes"));
        assert!(table.contains("| block | refused | no | 0 | 0 | refused | loading"));
    }

    #[test]
    fn the_matrix_holds_runs_to_what_the_check_said() {
        let states = check_states(
            "kernel 6.1: BTF yes\ncpu      ready\nheap     unavailable (needs x)\nblock    degraded (y)\nmutex    ready\noffcpu   ready\nunwind fp    ready\n",
        );
        assert_eq!(states.len(), 5);
        let run = |profile: &str, exit, ready, samples, error: Option<&str>| TypeResult {
            profile: profile.to_string(),
            exit: Some(exit),
            ready,
            files: u32::from(samples > 0),
            samples,
            error: error.map(str::to_string),
            warning: None,
        };
        let mut results = vec![
            run("cpu", 0, true, 10, None),
            run("heap", 1, false, 0, Some("the heap profile cannot run")),
            run("block", 0, true, 3, None),
            run("mutex", 0, true, 2, None),
            run("offcpu", 0, true, 5, None),
        ];
        assert!(disagreements(&results, &states).is_empty());
        // Said ready, wrote nothing; said unavailable, ran anyway.
        results[4].samples = 0;
        results[1] = run("heap", 0, true, 0, None);
        let wrong = disagreements(&results, &states);
        assert_eq!(wrong.len(), 2, "{wrong:?}");
        assert!(
            wrong[0].starts_with("heap: --check said unavailable"),
            "{wrong:?}"
        );
        assert!(
            wrong[1].starts_with("offcpu: --check said ready"),
            "{wrong:?}"
        );
        // A refusal the run agreed with is still a failure on these
        // kernels; the goroutine type and the unwinding rows are not
        // profile types of the matrix.
        assert_eq!(
            unavailable(&states),
            vec!["heap: unavailable on a kernel where every type works".to_string()]
        );
        let all_ready = check_states("cpu ready\nheap degraded (z)\nunwind fp ready\n");
        assert!(unavailable(&all_ready).is_empty());
    }

    #[test]
    fn reads_the_check_before_the_runs() {
        let output = "@@check begin\nkernel 6.1.176: BTF yes\ncpu      ready\n@@check end exit=1\n@@smoke cpu begin\n";
        let (text, exit) = parse_check(output).unwrap();
        assert_eq!(text, "kernel 6.1.176: BTF yes\ncpu      ready\n");
        assert_eq!(exit, Some(1));
        assert_eq!(parse_check(OUTPUT), None);
        // The check's lines are not a profile type's.
        assert_eq!(parse(output).len(), 1);
    }

    #[test]
    fn script_runs_every_type_for_the_given_time() {
        let s = script(3);
        assert!(s.contains("profilerd --check --profiles cpu,heap,block,mutex,offcpu"));
        assert!(s.contains("for type in cpu heap block mutex offcpu; do"));
        assert!(s.contains("--duration 3s --interval 3s"));
        assert!(s.contains("@@smoke $type end exit=$rc files=$files"));
    }

    #[test]
    fn notes_keep_the_verifiers_reason() {
        let error = "eBPF program sched_switch: the BPF_PROG_LOAD syscall returned Permission denied \
                     (os error 13). Verifier output: 0: R1=ctx() R10=fp0 ; a long log 306: (85) \
                     call bpf_probe_read_kernel#113 R2 min value is negative, either use unsigned \
                     or 'var &= const' verification time 213225 usec stack depth 288";
        let note = short(error);
        assert!(note.starts_with("eBPF program sched_switch: "), "{note}");
        assert!(
            note.ends_with("R2 min value is negative, either use unsigned or 'var &= const'"),
            "{note}"
        );
        assert!(!note.contains("R1=ctx"), "{note}");
        assert_eq!(short("brief"), "brief");
        assert_eq!(short(&"é".repeat(300)).chars().count(), 201);
    }

    #[test]
    fn log_lines_and_sample_counts() {
        assert_eq!(
            log_message("2026-01-01T00:00:00Z  WARN a::b: x: y"),
            Some(("WARN", "x: y"))
        );
        assert_eq!(log_message("plain output"), None);
        assert_eq!(
            samples_written("wrote /a (b)/c.pb.gz (7 samples, built in 1 ms)"),
            Some(7)
        );
        assert_eq!(samples_written("wrote nothing"), None);
    }
}
