//! The external reader: every profile file must be readable by
//! `go tool pprof`, the reference implementation of the format.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::run_with_timeout;

/// Bound on one `go tool pprof` run.
const PPROF_TIMEOUT: Duration = Duration::from_secs(60);

/// The `go` command: the first `go` on PATH, else /usr/lib/go/bin/go.
pub fn go_binary() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("go"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/lib/go/bin/go")])
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("`go` not found on PATH nor at /usr/lib/go/bin/go: install golang-go")
        })
}

/// Runs `go tool pprof ARGS FILE` and returns its stdout; panics with its
/// output unless it exits 0.
pub fn go_pprof(args: &[&str], file: &Path) -> String {
    let mut cmd = Command::new(go_binary());
    cmd.arg("tool").arg("pprof").args(args).arg(file);
    // pprof keeps state under $HOME; give it a place if the test has none.
    if std::env::var_os("HOME").is_none() {
        cmd.env("HOME", std::env::temp_dir());
    }
    let what = format!("go tool pprof {} {}", args.join(" "), file.display());
    let out = run_with_timeout(cmd, &what, PPROF_TIMEOUT);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "`{what}` failed with {}:\n{}\n{stdout}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// How many sample lines `go tool pprof -raw` printed: the lines of its
/// "Samples:" section that hold values followed by `:` and location ids.
pub fn raw_sample_lines(raw: &str) -> usize {
    raw.lines()
        .skip_while(|l| !l.starts_with("Samples:"))
        .skip(2) // "Samples:" and the sample type header
        .take_while(|l| !l.starts_with("Locations") && !l.starts_with("Mappings"))
        .filter(|l| {
            l.split_once(':').is_some_and(|(values, _)| {
                let mut fields = values.split_whitespace().peekable();
                fields.peek().is_some() && fields.all(|v| v.parse::<i64>().is_ok())
            })
        })
        .count()
}

/// Checks that `go tool pprof -raw FILE` exits 0 and, if `expect_samples`,
/// prints at least one sample. Returns the raw text.
pub fn check_readable(file: &Path, expect_samples: bool) -> String {
    let raw = go_pprof(&["-raw"], file);
    if expect_samples {
        assert!(
            raw_sample_lines(&raw) > 0,
            "`go tool pprof -raw {}` printed no samples:\n{raw}",
            file.display()
        );
    }
    raw
}

/// `go tool pprof -top` of a file (for failure reports), limited to
/// samples of `pid` if given. Never panics: errors come back as text.
pub fn top(file: &Path, pid: Option<u32>) -> String {
    let mut cmd = Command::new(go_binary());
    cmd.args(["tool", "pprof", "-top", "-nodecount=25"]);
    if let Some(pid) = pid {
        cmd.arg(format!("-tagfocus=pid={pid}"));
    }
    cmd.arg(file);
    if std::env::var_os("HOME").is_none() {
        cmd.env("HOME", std::env::temp_dir());
    }
    let out = run_with_timeout(cmd, "go tool pprof -top", PPROF_TIMEOUT);
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
