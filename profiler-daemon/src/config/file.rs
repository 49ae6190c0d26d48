//! The config file (`--config`, TOML): read with a size bound, parsed, and
//! its errors given as one line with the key and the line.

use super::*;

/// The config file as written. Types are as loose as the TOML allows and the
/// checks are the flags' ones, done in [`merge`].
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    pub(super) pid: Option<PidList>,
    pub(super) command: Option<Vec<String>>,
    pub(super) profiles: Option<ProfileList>,
    pub(super) duration: Option<String>,
    pub(super) interval: Option<String>,
    pub(super) output_dir: Option<PathBuf>,
    pub(super) cpu_frequency: Option<u64>,
    pub(super) heap_sample_bytes: Option<u64>,
    pub(super) go_heap_sampling: Option<String>,
    pub(super) block_rate: Option<String>,
    pub(super) mutex_fraction: Option<u64>,
    pub(super) unwind: Option<String>,
    pub(super) retention: Option<String>,
    // `label` is the flag's name (SPEC: "the same keys"), `labels` reads
    // better for a table; accept both.
    #[serde(alias = "label")]
    pub(super) labels: Option<BTreeMap<String, String>>,
    pub(super) push_url: Option<String>,
    pub(super) otlp_endpoint: Option<String>,
    pub(super) metrics_addr: Option<String>,
    pub(super) http_addr: Option<String>,
    pub(super) http_token_file: Option<std::path::PathBuf>,
    pub(super) http_metrics_without_token: Option<bool>,
    pub(super) push: Option<PushTable>,
    pub(super) otlp: Option<OtlpTable>,
    pub(super) limits: Option<LimitsTable>,
    pub(super) debug: Option<DebugTable>,
}

/// `pid = 1234` or `pid = [1234, 5678]`. Kept as i64 (TOML's integer) so an
/// out-of-range pid gets the same message as on the command line.
#[derive(Debug)]
pub(super) struct PidList(pub(super) Vec<i64>);

impl<'de> Deserialize<'de> for PidList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PidVisitor;
        impl<'de> Visitor<'de> for PidVisitor {
            type Value = PidList;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a process ID or a list of process IDs")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<PidList, E> {
                Ok(PidList(vec![v]))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<PidList, E> {
                i64::try_from(v)
                    .map(|v| PidList(vec![v]))
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PidList, A::Error> {
                let mut pids = Vec::new();
                while let Some(pid) = seq.next_element::<i64>()? {
                    pids.push(pid);
                }
                Ok(PidList(pids))
            }
        }
        deserializer.deserialize_any(PidVisitor)
    }
}

/// `profiles = "cpu,heap"` (like the flag) or `profiles = ["cpu", "heap"]`.
#[derive(Debug)]
pub(super) struct ProfileList(pub(super) Vec<String>);

impl<'de> Deserialize<'de> for ProfileList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ProfileVisitor;
        impl<'de> Visitor<'de> for ProfileVisitor {
            type Value = ProfileList;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a comma-separated string or a list of profile type names")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ProfileList, E> {
                Ok(ProfileList(v.split(',').map(str::to_owned).collect()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ProfileList, A::Error> {
                let mut names = Vec::new();
                while let Some(name) = seq.next_element::<String>()? {
                    names.push(name);
                }
                Ok(ProfileList(names))
            }
        }
        deserializer.deserialize_any(ProfileVisitor)
    }
}

/// Largest config file read: a real one is a few hundred bytes, and a
/// bound keeps a wrong path (a log, a device) from being read whole.
pub(super) const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

pub(super) fn read_config_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let read_err = |reason: String| ConfigError::ReadConfig {
        path: path.to_owned(),
        reason,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| read_err(io_reason(&e)))?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(read_err(format!(
            "larger than {} KiB, not a config file",
            MAX_CONFIG_BYTES / 1024
        )));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        read_err(format!(
            "not UTF-8 text (invalid byte at line {})",
            line_of(&String::from_utf8_lossy(&e.as_bytes()[..at]), at)
        ))
    })?;
    toml::from_str(&text).map_err(|e| {
        // toml's Display draws the offending line with a caret over several
        // lines; keep its message, the key and the line number only.
        let line = e.span().map(|span| line_of(&text, span.start));
        let message = toml_message(e.message());
        let message = match error_key(&e) {
            Some(key) if !message.contains(&format!("'{key}'")) => {
                format!("key '{key}': {message}")
            }
            _ => message,
        };
        ConfigError::ConfigFile {
            path: path.to_owned(),
            message,
            line,
        }
    })
}

/// The dotted key a toml error is about (control characters escaped), if
/// it says: toml only prints it (as "in `a.b`") when it has no input to
/// point into.
pub(super) fn error_key(error: &toml::de::Error) -> Option<String> {
    let mut bare = error.clone();
    bare.set_input(None);
    bare.to_string()
        .lines()
        .find_map(|l| l.strip_prefix("in `")?.strip_suffix('`').map(printable))
}

/// One-line form of a toml/serde message, in TOML's words ("key"), with
/// control characters (from the file's own strings) escaped.
pub(super) fn toml_message(message: &str) -> String {
    let one_line = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    // serde says "unknown field `foo`, expected one of `a`, `b`"; a file
    // author thinks in keys and quotes with ''.
    let message = match one_line.strip_prefix("unknown field `") {
        Some(rest) => format!("unknown key '{}", rest.replace('`', "'")),
        None => one_line,
    };
    printable(&message)
}

/// 1-based line of byte offset `pos` in `text`.
pub(super) fn line_of(text: &str, pos: usize) -> usize {
    let pos = pos.min(text.len());
    text.as_bytes()[..pos]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// An io::Error's description without std's " (os error N)" suffix, which
/// means nothing to a user.
pub(super) fn io_reason(err: &io::Error) -> String {
    let text = err.to_string();
    match err.raw_os_error() {
        Some(code) => text
            .strip_suffix(&format!(" (os error {code})"))
            .map(str::to_owned)
            .unwrap_or(text),
        None => text,
    }
}
