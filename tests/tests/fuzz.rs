//! The fuzzers' seed corpora and the inputs they found hard, through the
//! real binary: `profilerd top` and `profilerd flamegraph` on every seed
//! profile and on damaged copies, a gzip bomb, and a config file full of
//! terminal escapes. Each ends with a report or one escaped error line and
//! exit status 1 (2 for the config), never a panic or a signal, quickly.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use flate2::Compression;
use flate2::write::GzEncoder;
use profiler_tests::daemon::{profilerd_bin, require_root, workspace_root};
use profiler_tests::process::run_with_timeout;
use profiler_tests::temp_dir;

/// Every case is one file of at most a few KiB, or a bomb refused after
/// 256 MiB of inflating; this only bounds a hang.
const BOUND: Duration = Duration::from_secs(60);

fn profilerd(args: &[&Path]) -> Output {
    let mut cmd = Command::new(profilerd_bin());
    cmd.args(args)
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .env_remove("PROFILERD_LOG");
    run_with_timeout(cmd, "profilerd", BOUND)
}

/// The seed profiles of the fuzz targets that read pprof files.
fn seed_profiles() -> Vec<PathBuf> {
    let mut seeds = Vec::new();
    for target in ["report", "pprof_decode"] {
        let dir = workspace_root().join("fuzz/corpus").join(target);
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("corpus entry").path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if name.starts_with("seed-") {
                seeds.push(path);
            }
        }
    }
    seeds.sort();
    assert!(seeds.len() >= 6, "seed corpora missing: {seeds:?}");
    seeds
}

/// A report, or exit 1 with one line naming the subcommand; no SVG left
/// behind by a failed flame graph.
fn check_outcome(what: &str, out: &Output, svg: Option<&Path>) -> bool {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ctx = format!("{what}: {}, stderr:\n{stderr}", out.status);
    match out.status.code() {
        Some(0) => {
            if let Some(svg) = svg {
                let text = std::fs::read_to_string(svg).expect("the SVG was written");
                assert!(text.contains("<svg"), "{ctx}");
            } else {
                let stdout = String::from_utf8_lossy(&out.stdout);
                assert!(stdout.starts_with("File: "), "{ctx}\n{stdout}");
            }
            true
        }
        Some(1) => {
            assert_eq!(stderr.lines().count(), 1, "{ctx}");
            assert!(stderr.starts_with("profilerd "), "{ctx}");
            if let Some(svg) = svg {
                assert!(!svg.exists(), "{ctx}: a failed flame graph left {svg:?}");
            }
            false
        }
        _ => panic!("{ctx}\nexpected a report or exit status 1"),
    }
}

#[test]
fn seed_profiles_and_damaged_copies() {
    require_root();
    let dir = temp_dir();
    let svg = dir.path().join("out.svg");
    let mut reports = 0;
    let mut errors = 0;
    for seed in seed_profiles() {
        let bytes = std::fs::read(&seed).expect("read seed");
        let name = seed
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        // The seed, cut in half, and with bytes flipped through its middle.
        let half = bytes[..bytes.len() / 2].to_vec();
        let mut flipped = bytes.clone();
        for i in (bytes.len() / 3..bytes.len()).step_by(7) {
            flipped[i] ^= 0x5a;
        }
        for (variant, content) in [("whole", bytes), ("half", half), ("flipped", flipped)] {
            let file = dir.path().join(format!("{variant}-{name}"));
            std::fs::write(&file, &content).expect("write variant");
            let what = format!("top {variant} {name}");
            let ok = check_outcome(&what, &profilerd(&[Path::new("top"), &file]), None);
            let fg = profilerd(&[Path::new("flamegraph"), Path::new("-o"), &svg, &file]);
            check_outcome(&format!("flamegraph {variant} {name}"), &fg, Some(&svg));
            let _ = std::fs::remove_file(&svg);
            // Known truth: a whole seed profile from the daemon reads; a
            // truncated gzip stream does not.
            if variant == "whole" && !name.contains("truncated") {
                assert!(ok, "{what} must give a report");
            }
            if name.ends_with(".gz") && variant == "half" {
                assert!(!ok, "{what} must be an error");
            }
            if ok {
                reports += 1;
            } else {
                errors += 1;
            }
        }
    }
    eprintln!("{reports} reports, {errors} one-line errors");
}

#[test]
fn gzip_bomb_is_refused() {
    require_root();
    let dir = temp_dir();
    let bomb = dir.path().join("cpu-bomb.pb.gz");
    // 300 MiB of zeros in about 300 KiB: past the 256 MiB limit.
    let mut enc = GzEncoder::new(Vec::new(), Compression::best());
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..300 {
        enc.write_all(&chunk).expect("gzip into memory");
    }
    let bytes = enc.finish().expect("gzip into memory");
    assert!(bytes.len() < 1 << 20, "{}", bytes.len());
    std::fs::write(&bomb, &bytes).expect("write the bomb");
    let started = Instant::now();
    let out = profilerd(&[Path::new("top"), &bomb]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("cpu-bomb.pb.gz") && stderr.contains("more than 268435456 bytes"),
        "{stderr}"
    );
    eprintln!("bomb refused in {:?}", started.elapsed());
}

#[test]
fn config_escapes_are_not_echoed_raw() {
    require_root();
    let dir = temp_dir();
    let config = dir.path().join("hostile.toml");
    std::fs::write(
        &config,
        "\"pid\\u001b]0;owned\\u0007\" = 1\ninterval = \"1\\r\\u001b[2K\"\n",
    )
    .expect("write config");
    let out = profilerd(&[Path::new("--config"), &config]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        !stderr.trim_end().chars().any(char::is_control),
        "{stderr:?}"
    );
    assert!(stderr.contains("\\u{1b}]0;owned\\u{7}"), "{stderr}");
}
