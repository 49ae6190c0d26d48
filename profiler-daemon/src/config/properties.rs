//! Property tests of the config parser: any TOML file and any command line
//! give settings within their documented bounds or a one-line error that
//! echoes nothing a terminal would act on.

use std::io::Write;

use proptest::collection::vec;
use proptest::prelude::*;

use super::*;

/// The keys a config file may have, and some it may not.
const KEYS: [&str; 24] = [
    "pid",
    "command",
    "profiles",
    "duration",
    "interval",
    "output_dir",
    "cpu_frequency",
    "heap_sample_bytes",
    "go_heap_sampling",
    "block_rate",
    "mutex_fraction",
    "unwind",
    "retention",
    "push_url",
    "push",
    "otlp_endpoint",
    "otlp",
    "metrics_addr",
    "http_addr",
    "labels",
    "label",
    "nope",
    "pid\u{1b}[31m",
    "",
];

/// A TOML value: strings that look like the options' values or hold
/// control characters, numbers at the ends of their types, arrays, tables.
fn toml_value() -> impl Strategy<Value = String> {
    let string = prop_oneof![
        Just("30s".to_owned()),
        Just("off".to_owned()),
        Just("cpu,heap".to_owned()),
        Just("http://localhost:4040".to_owned()),
        Just("127.0.0.1:0".to_owned()),
        "[0-9]{0,20}[a-z]{0,3}",
        ".{0,12}",
        "[\\x00-\\x1f\\x7f\\u{9b}a]{0,6}",
    ];
    let scalar = prop_oneof![
        string.prop_map(|s| toml::Value::String(s).to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        Just("18446744073709551616".to_owned()),
        Just("-0".to_owned()),
        any::<bool>().prop_map(|b| b.to_string()),
        Just("1.5".to_owned()),
        Just("1979-05-27T07:32:00Z".to_owned()),
    ];
    scalar.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(", "))),
            vec(("[a-z\\x01]{0,4}", inner), 0..3).prop_map(|kv| {
                let kv: Vec<String> = kv
                    .into_iter()
                    .map(|(k, v)| format!("{} = {v}", toml::Value::String(k)))
                    .collect();
                format!("{{ {} }}", kv.join(", "))
            }),
        ]
    })
}

/// A file of `key = value` lines, sometimes with junk between them.
fn toml_file() -> impl Strategy<Value = String> {
    vec(
        prop_oneof![
            4 => (prop::sample::select(&KEYS[..]), toml_value())
                .prop_map(|(k, v)| format!("{} = {v}", toml::Value::String(k.to_owned()))),
            1 => ".{0,16}",
        ],
        0..6,
    )
    .prop_map(|lines| lines.join("\n"))
}

/// Parses `args` with `text` as the config file.
fn parse_with_file(text: &[u8], args: &[String]) -> Result<Settings, ConfigError> {
    let mut file = tempfile::NamedTempFile::new().expect("temporary config file");
    file.write_all(text).expect("write config file");
    let path = file.path().to_str().expect("temporary paths are UTF-8");
    let mut argv = vec![
        "profilerd".to_owned(),
        "--config".to_owned(),
        path.to_owned(),
    ];
    argv.extend(args.iter().cloned());
    Settings::parse_from(argv)
}

/// What every outcome must satisfy.
fn check(result: Result<Settings, ConfigError>) -> Result<(), TestCaseError> {
    match result {
        Ok(s) => {
            prop_assert!(s.interval >= MIN_INTERVAL);
            prop_assert!((1..=MAX_CPU_FREQUENCY).contains(&s.cpu_frequency));
            prop_assert!(s.heap_sample_bytes >= 1);
            prop_assert!(s.mutex_fraction >= 1);
            prop_assert!(!s.block_rate.is_zero());
            prop_assert!(!s.profiles.is_empty());
            prop_assert!(s.pids.is_empty() || s.command.is_empty());
            if let Some(r) = s.retention {
                prop_assert!(r > s.interval);
            }
            for (k, _) in &s.labels {
                prop_assert!(!RESERVED_LABELS.contains(&k.as_str()), "{}", k);
            }
        }
        Err(ConfigError::Help(_)) => {}
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(!msg.is_empty());
            // One line, and nothing echoed from the input that a terminal
            // would interpret (escape sequences, carriage returns).
            prop_assert!(
                !msg.chars().any(char::is_control),
                "control character in {:?}",
                msg
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_toml_file(text in toml_file()) {
        check(parse_with_file(text.as_bytes(), &[]))?;
    }

    #[test]
    fn any_bytes_as_a_file(bytes in vec(any::<u8>(), 0..64)) {
        check(parse_with_file(&bytes, &[]))?;
    }

    #[test]
    fn any_command_line(
        args in vec(
            prop_oneof![
                prop::sample::select(&[
                    "--pid", "--profiles", "--duration", "--interval", "--cpu-frequency",
                    "--heap-sample-bytes", "--block-rate", "--mutex-fraction", "--label",
                    "--unwind", "--retention", "--push-url", "--otlp-endpoint", "--metrics-addr", "--",
                    "--output-dir", "-3", "cpu", "1", "0", "env=prod",
                ][..]).prop_map(str::to_owned),
                ".{0,8}",
                "[\\x00-\\x1f\\x7fa=,]{0,6}",
            ],
            0..8,
        ),
    ) {
        let mut argv = vec!["profilerd".to_owned()];
        argv.extend(args);
        check(Settings::parse_from(argv))?;
    }
}

#[test]
fn control_characters_are_shown_escaped() {
    let e = parse_with_file(b"\"pid\\u001b[31m\" = 1\n", &[]).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("unknown key 'pid\\u{1b}[31m'"), "{msg}");
    let e = Settings::parse_from(["profilerd", "--duration", "1\r\x1b[2Kx"]).unwrap_err();
    assert!(
        e.to_string()
            .contains("invalid value '1\\r\\u{1b}[2Kx' for --duration"),
        "{e}"
    );
}
