//! Any bytes as the `--config` file: settings, or a one-line error with no
//! control characters echoed from the file.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use profilerd::config::{ConfigError, Settings};

/// One file, rewritten per input: the parser reads the file by its path.
fn config_path() -> &'static PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = DIR.get_or_init(|| tempfile::tempdir().expect("temporary directory"));
        dir.path().join("profilerd.toml")
    })
}

fuzz_target!(|data: &[u8]| {
    let path = config_path();
    std::fs::write(path, data).expect("write the config file");
    let args = [
        "profilerd".into(),
        "--config".into(),
        path.clone().into_os_string(),
    ];
    match Settings::parse_from(args) {
        Ok(_) | Err(ConfigError::Help(_)) => {}
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.chars().any(char::is_control), "{msg:?}");
        }
    }
});
