//! The OTLP export's settings: `--otlp-endpoint` (the receiver's base URL,
//! OTLP/HTTP) and the config file's `[otlp]` table, checked once at start
//! into [`OtlpSettings`] with the push's checks (push/settings.rs): a bad
//! URL, an unreadable token file or a malformed header stops the start
//! with one line.
//!
//! ```toml
//! otlp_endpoint = "http://collector:4318"   # base URL; /v1development/profiles is added
//!
//! [otlp]
//! service_name = "checkout"       # service.name of every resource; default per workload
//! basic_auth_user = "1234"        # with basic_auth_password_file
//! basic_auth_password_file = "/etc/profilerd/otlp-password"
//! bearer_token_file = "/var/run/secrets/otlp-token"   # or this; never both
//! headers = { "X-Scope-OrgID" = "team-a" }   # extra request headers
//! max_request_bytes = 67108864    # uncompressed, per request (OTLP/HTTP's recommended limit)
//! queue_bytes = 67108864          # requests waiting in memory (gzipped)
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use crate::config::push::{
    Auth, AuthKeys, Keys, Secret, SettingError, base_url, count, error, headers, redact,
};

/// The default URL path of the profiles signal at the pinned version.
pub const PROFILES_PATH: &str = "/v1development/profiles";
/// OTLP/HTTP's recommended bound on a request body before compression.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 64 << 20;
/// Bytes of requests waiting to be sent (gzipped).
pub const DEFAULT_QUEUE_BYTES: usize = 64 << 20;

const KEYS: Keys = Keys {
    url: "otlp_endpoint",
    user: "otlp.basic_auth_user",
    password_file: "otlp.basic_auth_password_file",
    bearer_file: "otlp.bearer_token_file",
    headers: "otlp.headers",
};

/// Validated OTLP export settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtlpSettings {
    /// The profiles signal's full URL, without userinfo (safe to log).
    pub url: String,
    /// `service.name` of every resource, instead of the per-workload one.
    pub service_name: Option<String>,
    /// The static `--label`s: attributes of every resource.
    pub static_labels: Vec<(String, String)>,
    pub auth: Option<Auth>,
    /// Extra headers; values may be secrets and are never logged.
    pub headers: Vec<(String, Secret)>,
    pub max_request_bytes: usize,
    pub queue_bytes: usize,
}

/// The `[otlp]` table as written; every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpTable {
    service_name: Option<String>,
    basic_auth_user: Option<String>,
    basic_auth_password_file: Option<PathBuf>,
    bearer_token_file: Option<PathBuf>,
    headers: Option<BTreeMap<String, String>>,
    max_request_bytes: Option<i64>,
    queue_bytes: Option<i64>,
}

/// The endpoint's full URL: the base, less a trailing profiles path if
/// given, with [`PROFILES_PATH`] added; and the userinfo taken out of it.
pub fn endpoint_url(raw: &str) -> Result<(String, Option<(String, Secret)>), String> {
    let (mut url, userinfo) = base_url(raw)?;
    let path = url.path().trim_end_matches('/');
    let base = path.strip_suffix(PROFILES_PATH).unwrap_or(path).to_owned();
    url.set_path(&format!("{base}{PROFILES_PATH}"));
    Ok((url.to_string(), userinfo))
}

/// Checks `--otlp-endpoint` and the `[otlp]` table; reads the secret files
/// (an unreadable or empty one is an error now, not a lost export later).
pub fn build(
    raw: &str,
    table: Option<&OtlpTable>,
    static_labels: &[(String, String)],
) -> Result<OtlpSettings, SettingError> {
    let (url, userinfo) =
        endpoint_url(raw).map_err(|why| error("otlp_endpoint", redact(raw), why))?;
    let empty = OtlpTable::default();
    let t = table.unwrap_or(&empty);
    let service_name = match &t.service_name {
        Some(name) if name.trim().is_empty() => {
            return Err(error("otlp.service_name", name, "expected a name"));
        }
        other => other.clone(),
    };
    let max_request_bytes = count(
        "otlp.max_request_bytes",
        t.max_request_bytes,
        4096..=(1 << 30),
    )?
    .unwrap_or(DEFAULT_MAX_REQUEST_BYTES);
    let queue_bytes =
        count("otlp.queue_bytes", t.queue_bytes, 1 << 20..=1 << 34)?.unwrap_or(DEFAULT_QUEUE_BYTES);
    let keys = AuthKeys {
        user: t.basic_auth_user.as_ref(),
        password_file: t.basic_auth_password_file.as_ref(),
        bearer_file: t.bearer_token_file.as_ref(),
    };
    let auth = crate::config::push::auth(&KEYS, &keys, userinfo)?;
    let headers = headers(&KEYS, t.headers.as_ref(), false, auth.is_some())?;
    Ok(OtlpSettings {
        url,
        service_name,
        static_labels: static_labels.to_vec(),
        auth,
        headers,
        max_request_bytes,
        queue_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> OtlpTable {
        toml::from_str(text).expect("an [otlp] table")
    }

    #[test]
    fn urls_get_the_profiles_path() {
        for (raw, want) in [
            ("http://c:4318", "http://c:4318/v1development/profiles"),
            ("http://c:4318/", "http://c:4318/v1development/profiles"),
            ("https://c/otlp", "https://c/otlp/v1development/profiles"),
            (
                "https://c/otlp/v1development/profiles",
                "https://c/otlp/v1development/profiles",
            ),
        ] {
            assert_eq!(endpoint_url(raw).unwrap().0, want, "{raw}");
        }
        let s = build("http://u:hunter2@c:4318", None, &[]).unwrap();
        assert_eq!(s.url, "http://c:4318/v1development/profiles");
        assert!(matches!(s.auth, Some(Auth::Basic { .. })));
        assert!(!format!("{s:?}").contains("hunter2"));
        let e = build("ftp://u:hunter2@c", None, &[]).unwrap_err();
        assert_eq!(e.key, "otlp_endpoint");
        assert!(!format!("{e:?}").contains("hunter2"));
    }

    #[test]
    fn bad_tables_are_one_line_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        let cases = [
            ("service_name = \"\"".to_owned(), "otlp.service_name"),
            (
                "max_request_bytes = 10".to_owned(),
                "otlp.max_request_bytes",
            ),
            ("queue_bytes = 1".to_owned(), "otlp.queue_bytes"),
            (
                "headers = { \"Content-Type\" = \"x\" }".to_owned(),
                "otlp.headers",
            ),
            (
                "headers = { \"Content-Encoding\" = \"x\" }".to_owned(),
                "otlp.headers",
            ),
            ("basic_auth_user = \"u\"".to_owned(), "otlp.basic_auth_user"),
            (
                format!("bearer_token_file = {missing:?}"),
                "otlp.bearer_token_file",
            ),
        ];
        for (text, key) in cases {
            let e = build("http://c", Some(&table(&text)), &[]).unwrap_err();
            assert_eq!(e.key, key, "{text}: {e:?}");
            assert!(!e.expected.contains('\n'), "{e:?}");
        }
        let ok = build(
            "http://c",
            Some(&table("headers = { \"X-Scope-OrgID\" = \"t\" }")),
            &[],
        )
        .unwrap();
        assert_eq!(ok.headers[0].0, "x-scope-orgid");
        assert_eq!(ok.max_request_bytes, 64 << 20);
    }
}
