//! The push's settings: `--push-url` (the server's base URL) and the config
//! file's `[push]` table, checked once at start into [`PushSettings`], so
//! that a bad URL, an unreadable token file or a malformed header stops the
//! start with one line instead of losing every push later.
//!
//! ```toml
//! push_url = "https://profiles.example:4040"   # base URL; /push.v1.PusherService/Push is added
//!
//! [push]
//! service_name = "checkout"       # default: per workload (namespace/container, systemd unit), else the node
//! labels = ["namespace", "container", "systemd_unit", "node"]   # sample labels kept as series labels
//! tenant = "team-a"               # X-Scope-OrgID
//! basic_auth_user = "1234"        # with basic_auth_password_file
//! basic_auth_password_file = "/etc/profilerd/push-password"
//! bearer_token_file = "/var/run/secrets/push-token"   # or this; never both
//! headers = { "X-Route" = "eu" }  # extra request headers
//! max_samples = 16000             # per uploaded profile (the server's default limit)
//! max_profile_bytes = 2080768     # uncompressed, per uploaded profile
//! max_label_names = 30            # per series
//! reject_older_than = "1h"        # windows older than this are not sent; "off" sends all
//! queue_bytes = 67108864          # uploads waiting in memory
//! ```
//!
//! Secrets (the password, the token, a URL's userinfo) are kept in
//! [`Secret`], whose `Debug` prints `***`; URLs are shown without userinfo.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::Url;
use reqwest::header::{HeaderName, HeaderValue};
use serde::Deserialize;

/// The Connect path of Pyroscope's push API (push.v1.PusherService/Push).
pub const PUSH_PATH: &str = "/push.v1.PusherService/Push";
/// Pyroscope's default `validation.max-profile-stacktrace-samples`.
pub const DEFAULT_MAX_SAMPLES: usize = 16_000;
/// Uncompressed bytes per uploaded profile. The server refuses more than
/// 4 MiB (`validation.max-profile-size-bytes`), and its rate limiter
/// refuses, with 429 on every retry, a single profile larger than its burst
/// (`distributor.ingestion-burst-size-mb`, 2 MiB, counted as the profile
/// plus its labels): so 2 MiB less a margin for the labels.
pub const DEFAULT_MAX_PROFILE_BYTES: usize = (2 << 20) - (16 << 10);
/// Pyroscope's default `validation.max-label-names-per-series`.
pub const DEFAULT_MAX_LABEL_NAMES: usize = 30;
/// Pyroscope's default `validation.reject-older-than`.
pub const DEFAULT_REJECT_OLDER_THAN: Duration = Duration::from_secs(3600);
/// Bytes of uploads waiting to be sent (gzipped), beside the queue's count.
pub const DEFAULT_QUEUE_BYTES: usize = 64 << 20;
/// Sample labels kept as series labels by default: where a process runs,
/// one series per workload and node. Process, thread and lock labels are
/// summed away (see series.rs).
pub const DEFAULT_LABELS: [&str; 4] = ["namespace", "container", "systemd_unit", "node"];
/// Pyroscope's limits on a label name and value (`validation.max-length-*`).
pub const MAX_LABEL_NAME_BYTES: usize = 1024;
pub const MAX_LABEL_VALUE_BYTES: usize = 2048;
/// Largest secret file read: a token is a few KiB at most.
const MAX_SECRET_BYTES: u64 = 64 << 10;
/// Headers the sinks set themselves and a `headers` entry may not replace.
const OWN_HEADERS: [&str; 8] = [
    "content-type",
    "content-length",
    "content-encoding",
    "connect-protocol-version",
    "connect-timeout-ms",
    "host",
    "transfer-encoding",
    "connection",
];

/// A secret value: never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }

    #[cfg(test)]
    pub(crate) fn for_tests(value: &str) -> Secret {
        Secret(value.to_owned())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Where a secret comes from: the URL (fixed) or a file, re-read when it
/// changes (connect.rs), as tokens are rotated in place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretSource {
    Url(Secret),
    File { path: PathBuf, first: Secret },
}

/// How requests authenticate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Auth {
    Basic {
        user: String,
        password: SecretSource,
    },
    Bearer(SecretSource),
}

/// The names of a sink's settings that hold credentials and headers, as
/// errors name them.
pub struct Keys {
    pub url: &'static str,
    pub user: &'static str,
    pub password_file: &'static str,
    pub bearer_file: &'static str,
    pub headers: &'static str,
}

const PUSH_KEYS: Keys = Keys {
    url: "push_url",
    user: "push.basic_auth_user",
    password_file: "push.basic_auth_password_file",
    bearer_file: "push.bearer_token_file",
    headers: "push.headers",
};

/// A table's credential keys as written (every one optional).
pub struct AuthKeys<'a> {
    pub user: Option<&'a String>,
    pub password_file: Option<&'a PathBuf>,
    pub bearer_file: Option<&'a PathBuf>,
}

/// Validated push settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushSettings {
    /// The push API's full URL, without userinfo (safe to log).
    pub url: String,
    /// `service_name` of every series, instead of the per-workload one.
    pub service_name: Option<String>,
    /// Sample labels kept as series labels: (label in the profile, its
    /// name in the push). The static `--label`s are always kept.
    pub keep: Vec<(String, String)>,
    /// `X-Scope-OrgID`.
    pub tenant: Option<String>,
    pub auth: Option<Auth>,
    /// Extra headers, checked; values may be secrets and are never logged.
    pub headers: Vec<(String, Secret)>,
    pub max_samples: usize,
    pub max_profile_bytes: usize,
    pub max_label_names: usize,
    /// `None`: every window is sent, whatever its age.
    pub reject_older_than: Option<Duration>,
    pub queue_bytes: usize,
}

/// The `[push]` table as written; every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushTable {
    service_name: Option<String>,
    labels: Option<Vec<String>>,
    tenant: Option<String>,
    basic_auth_user: Option<String>,
    basic_auth_password_file: Option<PathBuf>,
    bearer_token_file: Option<PathBuf>,
    headers: Option<BTreeMap<String, String>>,
    max_samples: Option<i64>,
    max_profile_bytes: Option<i64>,
    max_label_names: Option<i64>,
    reject_older_than: Option<String>,
    queue_bytes: Option<i64>,
}

/// A push setting that is not accepted: where (`push_url` or `push.KEY`),
/// the value as it may be shown, and what is expected.
#[derive(Debug, PartialEq, Eq)]
pub struct SettingError {
    pub key: &'static str,
    pub value: String,
    pub expected: String,
}

pub fn error(
    key: &'static str,
    value: impl fmt::Display,
    expected: impl Into<String>,
) -> SettingError {
    SettingError {
        key,
        value: value.to_string(),
        expected: expected.into(),
    }
}

/// The URL's target and the credentials its userinfo held.
#[derive(Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub url: String,
    pub userinfo: Option<(String, Secret)>,
}

/// Checks a `--push-url` value: http or https with a host, no query or
/// fragment. The path is the server's base (a reverse proxy's prefix, or
/// none); a trailing `/ingest` (the legacy API's path) or the push path
/// itself is taken off, then [`PUSH_PATH`] added. Userinfo becomes basic
/// auth and leaves the URL. The error is one line.
pub fn parse_url(raw: &str) -> Result<Endpoint, String> {
    let (mut url, userinfo) = base_url(raw)?;
    let path = url.path().trim_end_matches('/');
    let base = path
        .strip_suffix(PUSH_PATH)
        .or_else(|| path.strip_suffix("/ingest"))
        .unwrap_or(path)
        .to_owned();
    url.set_path(&format!("{base}{PUSH_PATH}"));
    Ok(Endpoint {
        url: url.to_string(),
        userinfo,
    })
}

/// A server's URL checked (http or https with a host, no query or
/// fragment), and its userinfo taken out of it. The error is one line.
pub fn base_url(raw: &str) -> Result<(Url, Option<(String, Secret)>), String> {
    let mut url = Url::parse(raw.trim()).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "the scheme must be http or https, not {}",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("the URL has no host".to_owned());
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("the URL must not have a query or fragment".to_owned());
    }
    let userinfo = match (url.username(), url.password()) {
        ("", None) => None,
        (user, password) => {
            let decode = |s: &str| {
                percent_decode(s).ok_or_else(|| "the URL's userinfo is not UTF-8".to_owned())
            };
            Some((decode(user)?, Secret(decode(password.unwrap_or(""))?)))
        }
    };
    // Infallible for http(s) URLs with a host.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    Ok((url, userinfo))
}

/// `%XX` sequences decoded (userinfo is percent-encoded in a URL).
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h)? * 16 + hex(l)?) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// `raw` as it may appear in a log or error: a userinfo (`user:pass@`) in
/// what looks like a URL's authority is replaced by `***@`, parsable or not.
pub fn redact(raw: &str) -> String {
    let Some(scheme_end) = raw.find("://") else {
        return raw.to_owned();
    };
    let start = scheme_end + 3;
    let end = raw[start..]
        .find(['/', '?', '#'])
        .map_or(raw.len(), |i| start + i);
    match raw[start..end].rfind('@') {
        Some(at) => format!("{}***{}", &raw[..start], &raw[start + at..]),
        None => raw.to_owned(),
    }
}

/// A label name the strictest Pyroscope accepts (Prometheus' legacy
/// syntax, which releases 1.x require): `[a-zA-Z_][a-zA-Z0-9_]*`.
pub fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= MAX_LABEL_NAME_BYTES
}

/// A profile label's name as a series label: the `.` and `-` that `--label`
/// allows become `_` (Pyroscope 1.x turns dots into underscores itself and
/// refuses dashes).
pub fn series_label_name(name: &str) -> String {
    name.chars()
        .map(|c| match c.is_ascii_alphanumeric() || c == '_' {
            true => c,
            false => '_',
        })
        .collect()
}

/// Names a series label may not have: Pyroscope's own (`__name__`,
/// `__profile_type__`, ... all start with `__`) and `service_name`, which
/// the push sets.
fn reserved(name: &str) -> bool {
    name.starts_with("__") || name == "service_name"
}

/// Checks the `[push]` table against the push URL, the static labels and
/// the interval. Reads the secret files (an unreadable or empty one is an
/// error now, not a lost push later).
pub fn build(
    url: &str,
    table: Option<&PushTable>,
    static_labels: &[(String, String)],
    interval: Duration,
) -> Result<PushSettings, SettingError> {
    let endpoint = parse_url(url).map_err(|why| error("push_url", redact(url), why))?;
    let empty = PushTable::default();
    let t = table.unwrap_or(&empty);

    let service_name = match &t.service_name {
        Some(name) if name.trim().is_empty() => {
            return Err(error("push.service_name", name, "expected a name"));
        }
        Some(name) if name.len() > MAX_LABEL_VALUE_BYTES => {
            return Err(error(
                "push.service_name",
                name,
                format!("longer than {MAX_LABEL_VALUE_BYTES} bytes"),
            ));
        }
        other => other.clone(),
    };

    let max_samples = count("push.max_samples", t.max_samples, 1..=i64::from(u32::MAX))?
        .unwrap_or(DEFAULT_MAX_SAMPLES);
    let max_profile_bytes = count(
        "push.max_profile_bytes",
        t.max_profile_bytes,
        4096..=(1 << 30),
    )?
    .unwrap_or(DEFAULT_MAX_PROFILE_BYTES);
    let max_label_names = count("push.max_label_names", t.max_label_names, 2..=1000)?
        .unwrap_or(DEFAULT_MAX_LABEL_NAMES);
    let queue_bytes =
        count("push.queue_bytes", t.queue_bytes, 1 << 20..=1 << 34)?.unwrap_or(DEFAULT_QUEUE_BYTES);

    let reject_older_than = match &t.reject_older_than {
        None => Some(DEFAULT_REJECT_OLDER_THAN),
        Some(raw) if matches!(raw.trim(), "off" | "0") => None,
        Some(raw) => Some(humantime::parse_duration(raw.trim()).map_err(|_| {
            error(
                "push.reject_older_than",
                raw,
                "expected a duration like 1h, or off",
            )
        })?),
    };
    if let Some(limit) = reject_older_than
        && interval >= limit
    {
        return Err(error(
            "push.reject_older_than",
            humantime::format_duration(limit),
            format!(
                "every window of the interval ({}) would be older than this when sent, \
                 and refused; shorten the interval, or raise this (and the server's \
                 validation.reject-older-than)",
                humantime::format_duration(interval)
            ),
        ));
    }

    let keep = keep_labels(t.labels.as_deref(), static_labels)?;
    // __name__ and service_name, __delta__ on heap series, and the kept
    // labels: the most a series can have.
    let most = 3 + keep.len();
    if most > max_label_names {
        return Err(error(
            "push.labels",
            format!("{} labels", keep.len()),
            format!(
                "with __name__, service_name and __delta__ a series could have {most} label \
                 names, more than push.max_label_names ({max_label_names}); keep fewer labels \
                 or --labels"
            ),
        ));
    }

    let tenant = match &t.tenant {
        Some(tenant) => Some(check_tenant(tenant)?),
        None => None,
    };
    let keys = AuthKeys {
        user: t.basic_auth_user.as_ref(),
        password_file: t.basic_auth_password_file.as_ref(),
        bearer_file: t.bearer_token_file.as_ref(),
    };
    let auth = auth(&PUSH_KEYS, &keys, endpoint.userinfo)?;
    let headers = headers(
        &PUSH_KEYS,
        t.headers.as_ref(),
        tenant.is_some(),
        auth.is_some(),
    )?;

    Ok(PushSettings {
        url: endpoint.url,
        service_name,
        keep,
        tenant,
        auth,
        headers,
        max_samples,
        max_profile_bytes,
        max_label_names,
        reject_older_than,
        queue_bytes,
    })
}

pub fn count(
    key: &'static str,
    value: Option<i64>,
    range: std::ops::RangeInclusive<i64>,
) -> Result<Option<usize>, SettingError> {
    match value {
        None => Ok(None),
        Some(v) if range.contains(&v) => Ok(usize::try_from(v).ok()),
        Some(v) => Err(error(
            key,
            v,
            format!("expected {} to {}", range.start(), range.end()),
        )),
    }
}

/// The kept labels as (profile label, series label): the configured list
/// (or [`DEFAULT_LABELS`]), then every static label.
fn keep_labels(
    configured: Option<&[String]>,
    static_labels: &[(String, String)],
) -> Result<Vec<(String, String)>, SettingError> {
    let defaults: Vec<String> = DEFAULT_LABELS.iter().map(|s| s.to_string()).collect();
    let mut keep: Vec<(String, String)> = Vec::new();
    for name in configured.unwrap_or(&defaults) {
        if !valid_label_name(name) || reserved(name) {
            return Err(error(
                "push.labels",
                name,
                "expected label names like container or node ([a-zA-Z_][a-zA-Z0-9_]*, \
                 not service_name or __*)",
            ));
        }
        if !keep.iter().any(|(k, _)| k == name) {
            keep.push((name.clone(), name.clone()));
        }
    }
    for (key, _) in static_labels {
        // service_name as a --label names the service (series.rs).
        if key == "service_name" || keep.iter().any(|(k, _)| k == key) {
            continue;
        }
        let name = series_label_name(key);
        if reserved(&name) || !valid_label_name(&name) {
            return Err(error(
                "push.labels",
                key,
                "a --label pushed to Pyroscope may not start with __ (reserved there)",
            ));
        }
        if let Some((other, _)) = keep.iter().find(|(_, n)| *n == name) {
            return Err(error(
                "push.labels",
                key,
                format!("the labels '{other}' and '{key}' would both be '{name}' in Pyroscope"),
            ));
        }
        keep.push((key.clone(), name));
    }
    Ok(keep)
}

/// A tenant id as Pyroscope (dskit) accepts it: up to 150 of
/// `[a-zA-Z0-9!-_.*'()]`, not `.` or `..`.
fn check_tenant(tenant: &str) -> Result<String, SettingError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "!-_.*'()".contains(c);
    if tenant.is_empty()
        || tenant.len() > 150
        || !tenant.chars().all(ok_char)
        || tenant == "."
        || tenant == ".."
    {
        return Err(error(
            "push.tenant",
            tenant,
            "expected a tenant id of up to 150 letters, digits and !-_.*'()",
        ));
    }
    Ok(tenant.to_owned())
}

/// The credentials of a sink: basic auth from the URL's userinfo or from
/// a user and a password file, or a bearer token from a file; at most one.
pub fn auth(
    names: &Keys,
    t: &AuthKeys,
    userinfo: Option<(String, Secret)>,
) -> Result<Option<Auth>, SettingError> {
    let file = |key: &'static str, path: &Path| {
        read_secret(path)
            .map(|first| SecretSource::File {
                path: path.to_owned(),
                first,
            })
            .map_err(|why| error(key, path.display(), why))
    };
    let both = |path: &Path| {
        error(
            names.bearer_file,
            path.display(),
            "basic auth and a bearer token cannot both be set",
        )
    };
    match (t.user, t.password_file, t.bearer_file, userinfo) {
        (None, None, None, None) => Ok(None),
        (None, None, None, Some((user, password))) => Ok(Some(Auth::Basic {
            user,
            password: SecretSource::Url(password),
        })),
        (Some(user), Some(path), None, None) => {
            if user.is_empty() || user.contains(':') || user.chars().any(char::is_control) {
                return Err(error(names.user, user, "expected a user name without ':'"));
            }
            Ok(Some(Auth::Basic {
                user: user.clone(),
                password: file(names.password_file, path)?,
            }))
        }
        (None, None, Some(path), None) => Ok(Some(Auth::Bearer(file(names.bearer_file, path)?))),
        (Some(user), None, _, _) => Err(error(
            names.user,
            user,
            format!("needs {}", names.password_file),
        )),
        (None, Some(path), _, _) => Err(error(
            names.password_file,
            path.display(),
            format!("needs {}", names.user),
        )),
        (_, _, Some(path), _) if t.user.is_some() => Err(both(path)),
        (_, _, _, Some((user, _))) => Err(error(
            names.url,
            format!("{user}:***@..."),
            format!(
                "credentials in the URL and in [{}] cannot both be set",
                names.user.split('.').next().unwrap_or_default()
            ),
        )),
        (_, _, Some(path), None) => Err(both(path)),
    }
}

/// Reads a secret file: its text with surrounding whitespace (the final
/// newline) removed; empty, unreadable, not UTF-8 or unusable in a header
/// is an error (one line, without the content).
pub fn read_secret(path: &Path) -> Result<Secret, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_SECRET_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read it: {}", io_reason(&e)))?;
    if bytes.len() as u64 > MAX_SECRET_BYTES {
        return Err(format!("larger than {} KiB", MAX_SECRET_BYTES / 1024));
    }
    let text = String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_owned())?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err("the file is empty".to_owned());
    }
    if HeaderValue::from_str(secret).is_err() || secret.contains(['\r', '\n']) {
        return Err("holds characters a request header cannot carry".to_owned());
    }
    Ok(Secret(secret.to_owned()))
}

fn io_reason(err: &std::io::Error) -> String {
    let text = err.to_string();
    match err.raw_os_error() {
        Some(code) => text
            .strip_suffix(&format!(" (os error {code})"))
            .map_or(text.clone(), str::to_owned),
        None => text,
    }
}

/// A sink's extra headers, checked: names a header may have, values a
/// header can carry, none that the sink sets itself.
pub fn headers(
    names: &Keys,
    table: Option<&BTreeMap<String, String>>,
    tenant: bool,
    auth: bool,
) -> Result<Vec<(String, Secret)>, SettingError> {
    let mut out = Vec::new();
    for (name, value) in table.into_iter().flatten() {
        let Ok(parsed) = HeaderName::from_bytes(name.as_bytes()) else {
            return Err(error(names.headers, name, "not a header name"));
        };
        let lower = parsed.as_str();
        let taken = OWN_HEADERS.contains(&lower)
            || (tenant && lower == "x-scope-orgid")
            || (auth && lower == "authorization");
        if taken {
            return Err(error(
                names.headers,
                name,
                "the sink sets this header itself (tenant and auth have their own keys)",
            ));
        }
        if HeaderValue::from_str(value).is_err() {
            // The value may be a secret: not echoed.
            return Err(error(
                names.headers,
                name,
                "the value holds characters a header cannot carry",
            ));
        }
        out.push((lower.to_owned(), Secret(value.clone())));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    fn table(toml_text: &str) -> PushTable {
        toml::from_str(toml_text).expect("a [push] table")
    }

    #[test]
    fn urls_become_the_push_path() {
        let url = |raw: &str| parse_url(raw).map(|e| e.url);
        assert_eq!(
            url("http://localhost:4040").unwrap(),
            "http://localhost:4040/push.v1.PusherService/Push"
        );
        assert_eq!(
            url("https://p.example/").unwrap(),
            "https://p.example/push.v1.PusherService/Push"
        );
        for raw in [
            "http://10.0.0.1:8080/proxy/",
            "http://10.0.0.1:8080/proxy/ingest",
            "http://10.0.0.1:8080/proxy/push.v1.PusherService/Push",
        ] {
            assert_eq!(
                url(raw).unwrap(),
                "http://10.0.0.1:8080/proxy/push.v1.PusherService/Push",
                "{raw}"
            );
        }
        for bad in [
            "",
            "localhost:4040",
            "ftp://x/",
            "http://",
            "http://h/?x=1",
            "http://a b/",
        ] {
            let e = parse_url(bad).unwrap_err();
            assert!(!e.contains('\n'), "{bad}: {e}");
        }
    }

    #[test]
    fn userinfo_is_basic_auth_and_never_shown() {
        let e = parse_url("https://12%3A4:s%40cret@p.example/x").unwrap();
        assert_eq!(e.url, "https://p.example/x/push.v1.PusherService/Push");
        let (user, password) = e.userinfo.unwrap();
        assert_eq!((user.as_str(), password.expose()), ("12:4", "s@cret"));
        assert_eq!(format!("{password:?}"), "***");
        assert_eq!(
            redact("https://u:pw@h:1/p?q"),
            "https://***@h:1/p?q".to_owned()
        );
        assert_eq!(redact("http://a b:pw@h/"), "http://***@h/");
        assert_eq!(redact("http://h/p@x"), "http://h/p@x");
        assert_eq!(redact("no url"), "no url");
        let s = build("http://u:hunter2@h", None, &[], MIN).unwrap();
        assert!(!format!("{s:?}").contains("hunter2"), "{s:?}");
        let err = build("ftp://u:hunter2@h", None, &[], MIN).unwrap_err();
        assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
    }

    #[test]
    fn defaults() {
        let s = build("http://h:4040", None, &[("env".into(), "prod".into())], MIN).unwrap();
        let keep: Vec<&str> = s.keep.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(
            keep,
            ["namespace", "container", "systemd_unit", "node", "env"]
        );
        assert_eq!(s.max_samples, 16_000);
        assert!(s.max_profile_bytes < 2 << 20);
        assert_eq!(s.reject_older_than, Some(Duration::from_secs(3600)));
        assert_eq!((s.tenant, s.auth, s.headers.len()), (None, None, 0));
    }

    #[test]
    fn static_label_names_are_made_pyroscope_names() {
        let labels = [
            ("k8s.cluster".to_owned(), "a".to_owned()),
            ("team-x".to_owned(), "b".to_owned()),
            ("service_name".to_owned(), "svc".to_owned()),
        ];
        let s = build("http://h", Some(&table("labels = []")), &labels, MIN).unwrap();
        assert_eq!(
            s.keep,
            [
                ("k8s.cluster".to_owned(), "k8s_cluster".to_owned()),
                ("team-x".to_owned(), "team_x".to_owned()),
            ]
        );
        let clash = [
            ("a.b".to_owned(), "1".to_owned()),
            ("a-b".to_owned(), "2".to_owned()),
        ];
        let e = build("http://h", None, &clash, MIN).unwrap_err();
        assert_eq!(e.key, "push.labels");
        let reserved = [("__x".to_owned(), "1".to_owned())];
        assert!(build("http://h", None, &reserved, MIN).is_err());
    }

    #[test]
    fn bad_tables_are_one_line_errors() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let missing = dir.path().join("missing");
        let cases = [
            ("labels = [\"pid\", \"x-y\"]", "push.labels"),
            ("labels = [\"service_name\"]", "push.labels"),
            ("labels = [\"__name__\"]", "push.labels"),
            ("tenant = \"a|b\"", "push.tenant"),
            ("tenant = \"\"", "push.tenant"),
            ("service_name = \" \"", "push.service_name"),
            ("max_samples = 0", "push.max_samples"),
            ("max_profile_bytes = 10", "push.max_profile_bytes"),
            ("max_label_names = 4", "push.labels"),
            ("reject_older_than = \"soon\"", "push.reject_older_than"),
            ("reject_older_than = \"30s\"", "push.reject_older_than"),
            ("basic_auth_user = \"u\"", "push.basic_auth_user"),
            ("headers = { \"Content-Type\" = \"x\" }", "push.headers"),
            ("headers = { \"bad name\" = \"x\" }", "push.headers"),
            ("headers = { \"X-A\" = \"line\\nbreak\" }", "push.headers"),
            (
                "tenant = \"t\"\nheaders = { \"X-Scope-OrgID\" = \"u\" }",
                "push.headers",
            ),
        ];
        let mut cases: Vec<(String, &str)> =
            cases.iter().map(|(t, k)| (t.to_string(), *k)).collect();
        for (file, key) in [
            (&empty, "push.bearer_token_file"),
            (&missing, "push.bearer_token_file"),
        ] {
            cases.push((format!("bearer_token_file = {:?}", file), key));
        }
        cases.push((
            format!(
                "basic_auth_user = \"u\"\nbasic_auth_password_file = {:?}",
                missing
            ),
            "push.basic_auth_password_file",
        ));
        cases.push((
            format!(
                "basic_auth_user = \"u\"\nbasic_auth_password_file = {:?}\nbearer_token_file = {:?}",
                empty, empty
            ),
            "push.bearer_token_file",
        ));
        for (text, key) in &cases {
            let e = build("http://h", Some(&table(text)), &[], MIN).unwrap_err();
            assert_eq!(e.key, *key, "{text}: {e:?}");
            assert!(
                !e.expected.contains('\n') && !e.value.contains('\n'),
                "{text}: {e:?}"
            );
        }
        // Credentials twice.
        let token = dir.path().join("token");
        std::fs::write(&token, "tok\n").unwrap();
        let t = table(&format!("bearer_token_file = {token:?}"));
        assert_eq!(
            build("http://u:p@h", Some(&t), &[], MIN).unwrap_err().key,
            "push_url"
        );
    }

    #[test]
    fn secrets_come_from_files_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "  abc.def\n").unwrap();
        let t = table(&format!(
            "bearer_token_file = {token:?}\ntenant = \"team-a\"\nheaders = {{ \"X-Route\" = \"eu\" }}"
        ));
        let s = build("http://h", Some(&t), &[], MIN).unwrap();
        match &s.auth {
            Some(Auth::Bearer(SecretSource::File { first, .. })) => {
                assert_eq!(first.expose(), "abc.def")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s.tenant.as_deref(), Some("team-a"));
        assert_eq!(s.headers[0].0, "x-route");
        assert!(!format!("{s:?}").contains("abc.def"));
        let off = table("reject_older_than = \"off\"");
        let long = Duration::from_secs(7200);
        assert_eq!(
            build("http://h", Some(&off), &[], long)
                .unwrap()
                .reject_older_than,
            None
        );
    }
}
