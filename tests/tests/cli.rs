//! Bad input through the real binary: every case ends at once with a
//! non-zero status, exactly one line on stderr naming the problem, and no
//! output written. Also: no privilege to load eBPF.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use profiler_tests::daemon::{profilerd_bin, require_root};
use profiler_tests::process::run_with_timeout;
use profiler_tests::profiles::dir_entries;
use profiler_tests::temp_dir;

/// Bad input must fail at once; this only bounds a hang.
const BOUND: Duration = Duration::from_secs(15);

fn run(cmd: Command) -> Output {
    let mut cmd = cmd;
    cmd.env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .env_remove("PROFILERD_LOG");
    run_with_timeout(cmd, "profilerd", BOUND)
}

/// Runs `profilerd ARGS` and checks the bad-input contract. `code`: the
/// exact exit status expected, if the contract fixes it. `mentions`: what
/// the line must name (case-insensitive). `out`: the output directory,
/// which must stay absent or empty.
fn assert_rejected(args: &[&str], code: Option<i32>, mentions: &[&str], out: &Path) {
    require_root();
    let mut cmd = Command::new(profilerd_bin());
    cmd.args(args);
    let output = run(cmd);
    check_rejection(
        &output,
        &format!("profilerd {}", args.join(" ")),
        code,
        mentions,
        out,
    );
}

fn check_rejection(output: &Output, what: &str, code: Option<i32>, mentions: &[&str], out: &Path) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let ctx = format!(
        "`{what}`: status {}, stderr:\n{stderr}\nstdout:\n{stdout}",
        output.status
    );
    assert!(
        !output.status.success(),
        "{ctx}\nbad input must give a non-zero exit status"
    );
    assert!(
        output.status.code().is_some(),
        "{ctx}\nthe program must exit, not die of a signal"
    );
    if let Some(code) = code {
        assert_eq!(
            output.status.code(),
            Some(code),
            "{ctx}\nexit status for bad input"
        );
    }
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{ctx}\nexpected exactly one line on stderr");
    let line = lines[0].to_lowercase();
    for m in mentions {
        assert!(
            line.contains(&m.to_lowercase()),
            "{ctx}\nthe error line must mention {m:?}"
        );
    }
    let left = dir_entries(out);
    assert!(
        left.is_empty(),
        "{ctx}\nnothing may be written, but {} holds {left:?}",
        out.display()
    );
}

#[test]
fn unknown_option() {
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    assert_rejected(
        &["--frobnicate", "--output-dir", out.to_str().unwrap()],
        Some(2),
        &["--frobnicate"],
        &out,
    );
    assert!(
        !out.exists(),
        "the output dir must not be created on bad input"
    );
}

#[test]
fn malformed_duration() {
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    assert_rejected(
        &["--duration", "abc", "--output-dir", out.to_str().unwrap()],
        Some(2),
        &["abc", "duration"],
        &out,
    );
    assert!(
        !out.exists(),
        "the output dir must not be created on bad input"
    );
}

#[test]
fn pid_that_does_not_exist() {
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    assert_rejected(
        &["--pid", "999999999", "--output-dir", out.to_str().unwrap()],
        Some(2),
        &["999999999"],
        &out,
    );
    assert!(
        !out.exists(),
        "the output dir must not be created on bad input"
    );
}

#[test]
fn unknown_profile_type() {
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    assert_rejected(
        &["--profiles", "nope", "--output-dir", out.to_str().unwrap()],
        Some(2),
        &["nope"],
        &out,
    );
    assert!(
        !out.exists(),
        "the output dir must not be created on bad input"
    );
}

#[test]
fn malformed_config_file() {
    let tmp = temp_dir();
    let out = tmp.path().join("out");
    let config = tmp.path().join("broken-config.toml");
    std::fs::write(&config, "interval = \"2s\"\nduration = [oops\n").unwrap();
    assert_rejected(
        &[
            "--config",
            config.to_str().unwrap(),
            "--output-dir",
            out.to_str().unwrap(),
        ],
        Some(2),
        &["broken-config.toml"],
        &out,
    );
    assert!(
        !out.exists(),
        "the output dir must not be created on bad input"
    );
}

#[test]
fn output_dir_under_a_regular_file() {
    let tmp = temp_dir();
    let file = tmp.path().join("plain-file");
    std::fs::write(&file, "not a directory").unwrap();
    let out = file.join("out");
    assert_rejected(
        &["--output-dir", out.to_str().unwrap(), "--duration", "2s"],
        None,
        &[out.to_str().unwrap()],
        &out,
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "not a directory",
        "the regular file must be left alone"
    );
}

#[test]
fn output_dir_that_is_a_regular_file() {
    let tmp = temp_dir();
    let file = tmp.path().join("plain-file");
    std::fs::write(&file, "not a directory").unwrap();
    assert_rejected(
        &["--output-dir", file.to_str().unwrap(), "--duration", "2s"],
        None,
        &[file.to_str().unwrap()],
        &tmp.path().join("absent"),
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "not a directory",
        "the regular file must be left alone"
    );
}

#[test]
fn no_privilege_to_load_ebpf() {
    require_root();
    let tmp = temp_dir();
    // Everything the unprivileged user needs: a copy of the binary it can
    // run and an output directory it can write.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = tmp.path().join("profilerd");
    std::fs::copy(profilerd_bin(), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();

    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
        "--",
    ])
    .arg(&bin)
    .args(["--output-dir", out.to_str().unwrap(), "--duration", "2s"]);
    let output = run(cmd);
    let stderr = String::from_utf8_lossy(&output.stderr).to_lowercase();
    assert!(
        stderr.contains("privilege") || stderr.contains("cap_bpf"),
        "as an unprivileged user the error must say what is missing (privilege / CAP_BPF); stderr:\n{stderr}"
    );
    check_rejection(&output, "profilerd as uid 65534", None, &[], &out);
}
