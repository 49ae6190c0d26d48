//! What the tests of the daemon's sinks (the push to Pyroscope, the OTLP
//! export) share: running the daemon to its end, the files it wrote as the
//! truth to compare with, and the exit summary's counts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::daemon::Daemon;
use crate::profiles::{ProfileFile, read_profiles};
use crate::standin::Request;
use crate::workloads::Workload;

/// Bound on a run whose command works for a few seconds, shutdown grace
/// included.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// Every profile file in `dir` of the given kinds, with its kind.
pub fn files_of(dir: &Path, kinds: &[&str]) -> Vec<(String, ProfileFile)> {
    let mut all = Vec::new();
    for kind in kinds {
        for f in read_profiles(dir, kind) {
            all.push((kind.to_string(), f));
        }
    }
    all
}

/// The daemon's arguments for a sink test: `out`, the profile types and
/// interval, the sink's flag (`--push-url`, `--otlp-endpoint`) with `url`,
/// two static labels (`env=e2e`, `team.name=profiling`), and `config`.
pub fn sink_args(
    out: &Path,
    config: Option<&Path>,
    (flag, url): (&str, &str),
    profiles: &str,
    interval: &str,
) -> Vec<String> {
    let mut args: Vec<String> = [
        "--output-dir",
        &out.display().to_string(),
        "--profiles",
        profiles,
        "--interval",
        interval,
        flag,
        url,
        "--label",
        "env=e2e",
        "--label",
        "team.name=profiling",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(config) = config {
        args.extend(["--config".to_string(), config.display().to_string()]);
    }
    args
}

/// Checks what every request of a sink test carries: the `X-Route: e2e`
/// header of the test's config and the daemon's user agent.
pub fn check_common_headers(r: &Request) {
    assert_eq!(
        r.headers.get("x-route").map(String::as_str),
        Some("e2e"),
        "{:?}",
        r.headers
    );
    assert!(
        r.headers
            .get("user-agent")
            .is_some_and(|u| u.starts_with("profilerd/")),
        "{:?}",
        r.headers
    );
}

/// Checks the requests that carry `file`'s window: none when the window
/// has no samples (an empty window is not sent; then `None`), some
/// otherwise.
pub fn window_carriers<T>(file: &ProfileFile, carriers: Vec<T>, diag: &str) -> Option<Vec<T>> {
    if file.profile.sample.is_empty() {
        assert!(
            carriers.is_empty(),
            "{}: an empty window was sent{diag}",
            file.name()
        );
        return None;
    }
    assert!(!carriers.is_empty(), "{}: not sent{diag}", file.name());
    Some(carriers)
}

/// The files of a sink test's real run in `dir`: the mixed workload built
/// as `name`, the output directory, and a config file whose text `config`
/// makes of the path of a token file holding `token`.
pub fn mixed_run_files(
    dir: &Path,
    name: &str,
    token: &str,
    config: impl Fn(&Path) -> String,
) -> (PathBuf, PathBuf, PathBuf) {
    let exe = Workload::Mixed.build(dir, name);
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let config_file = dir.join("profilerd.toml");
    std::fs::write(&config_file, config(&token_file)).unwrap();
    (exe, dir.join("out"), config_file)
}

/// Sum of each sample type's values.
pub fn totals(p: &pprof_proto::Profile) -> Vec<i64> {
    let mut t = vec![0i64; p.sample_type.len()];
    for s in &p.sample {
        for (a, v) in t.iter_mut().zip(&s.value) {
            *a += v;
        }
    }
    t
}

/// Starts the daemon with `args`, waits for it to be ready and to exit
/// (its command ends), and checks it exited 0.
pub fn run_daemon(args: &[String]) -> Daemon {
    let mut daemon = Daemon::start(args);
    daemon.wait_ready();
    let status = daemon.wait_exit(RUN_TIMEOUT);
    assert!(
        status.success(),
        "profilerd exited with {status}\n{}",
        daemon.describe()
    );
    daemon
}

/// The exit summary's line of the sink `name` (`push`, `otlp`).
pub fn sink_summary(daemon: &Daemon, name: &str) -> String {
    let prefix = format!("{name}: ");
    daemon
        .stderr_lines()
        .into_iter()
        .find(|l| l.contains(&prefix) && l.contains("uploads sent"))
        .unwrap_or_else(|| panic!("no {name} summary\n{}", daemon.describe()))
}

/// A number that the summary gives before `what`: "... 3 uploads sent".
pub fn summary_count(summary: &str, what: &str) -> u64 {
    let at = summary
        .find(what)
        .unwrap_or_else(|| panic!("no '{what}' in {summary:?}"));
    summary[..at]
        .split_whitespace()
        .last()
        .and_then(|n| n.trim_start_matches('(').parse().ok())
        .unwrap_or_else(|| panic!("no count before '{what}' in {summary:?}"))
}

/// Runs the daemon once per case in `cases` (extra arguments, and what its
/// one-line error must name) with a 1 s duration: each must exit 2 with one
/// line, never echo `secret`, and write nothing to `out`.
pub fn check_refused_settings(out: &Path, cases: &[(Vec<String>, &str)], secret: &str) {
    for (extra, needle) in cases {
        let mut args = vec![
            "--output-dir".to_string(),
            out.display().to_string(),
            "--duration".into(),
            "1s".into(),
        ];
        args.extend(extra.iter().cloned());
        let mut daemon = Daemon::start(&args);
        let status = daemon.wait_exit(Duration::from_secs(10));
        let lines = daemon.stderr_lines();
        assert_eq!(status.code(), Some(2), "{extra:?}: {}", daemon.describe());
        assert_eq!(lines.len(), 1, "{extra:?}: {lines:?}");
        assert!(lines[0].contains(needle), "{extra:?}: {lines:?}");
        assert!(!lines[0].contains(secret), "{lines:?}");
        assert!(!out.exists(), "{extra:?}: the output directory was created");
    }
}
