//! The command line over the config file over the defaults, each value
//! checked, into [`Settings`]; an error names the flag or key it came from.

use super::cli::Cli;
use super::file::*;
use super::*;

/// Where a value came from, for error messages: `--flag` or the file key.
pub(super) fn origin(flag: &str, key: &str, file: Option<&Path>) -> String {
    match file {
        Some(path) => format!(
            "'{key}' in config file {}",
            printable(&path.display().to_string())
        ),
        None => format!("--{flag}"),
    }
}

/// Picks the flag's value if given, else the file's, with its origin.
pub(super) fn pick<T>(
    flag_value: Option<T>,
    file_value: Option<T>,
    flag: &str,
    key: &str,
    file: Option<&Path>,
) -> Option<(T, String)> {
    match (flag_value, file_value) {
        (Some(v), _) => Some((v, origin(flag, key, None))),
        (None, Some(v)) => Some((v, origin(flag, key, file))),
        (None, None) => None,
    }
}

/// A push or OTLP setting refused: the URL under the option it came from
/// (`url_key` names it), a table key under the file it is in, or quoted
/// alone when it is a default (no file).
pub(super) fn sink_error(
    e: crate::config::push::SettingError,
    url_key: &str,
    opt: &str,
    path: Option<&Path>,
) -> ConfigError {
    match e.key {
        key if key == url_key => invalid(opt, e.value, e.expected),
        key if path.is_none() => invalid(&format!("'{key}'"), e.value, e.expected),
        key => invalid(&origin("", key, path), e.value, e.expected),
    }
}

pub(super) fn invalid(
    option: &str,
    value: impl fmt::Display,
    expected: impl Into<String>,
) -> ConfigError {
    ConfigError::InvalidValue {
        option: printable(option),
        value: printable(&value.to_string()),
        expected: printable(&expected.into()),
    }
}

pub(super) fn merge(
    cli: Cli,
    file: Option<(PathBuf, FileConfig)>,
) -> Result<Settings, ConfigError> {
    let (path, fc) = match file {
        Some((path, fc)) => (Some(path), fc),
        None => (None, FileConfig::default()),
    };
    let path = path.as_deref();

    let (pids, command) = merge_target(&cli, &fc, path)?;
    let (profiles, best_effort) = merge_profiles(cli.profiles, fc.profiles, path)?;

    let duration = match pick(cli.duration, fc.duration, "duration", "duration", path) {
        Some((raw, opt)) => {
            let d = parse_duration(&raw, &opt)?;
            if d.is_zero() {
                return Err(invalid(&opt, raw, "the duration must be longer than 0s"));
            }
            Some(d)
        }
        None => None,
    };

    let interval = match pick(cli.interval, fc.interval, "interval", "interval", path) {
        Some((raw, opt)) => {
            let d = parse_duration(&raw, &opt)?;
            if d < MIN_INTERVAL {
                return Err(invalid(&opt, raw, "the interval must be at least 1s"));
            }
            d
        }
        None => DEFAULT_INTERVAL,
    };

    let output_dir = match pick(
        cli.output_dir,
        fc.output_dir,
        "output-dir",
        "output_dir",
        path,
    ) {
        Some((dir, opt)) => {
            if dir.as_os_str().is_empty() {
                return Err(invalid(&opt, "", "expected a directory path"));
            }
            dir
        }
        None => PathBuf::from(DEFAULT_OUTPUT_DIR),
    };

    let cpu_frequency = number(
        cli.cpu_frequency,
        fc.cpu_frequency,
        ("cpu-frequency", "cpu_frequency", path),
        1..=MAX_CPU_FREQUENCY,
        "expected samples per second from 1 to 10000",
    )?
    .unwrap_or(DEFAULT_CPU_FREQUENCY);

    let heap_sample_bytes = number(
        cli.heap_sample_bytes,
        fc.heap_sample_bytes,
        ("heap-sample-bytes", "heap_sample_bytes", path),
        1..=u64::MAX,
        "expected a number of bytes, at least 1",
    )?
    .unwrap_or(DEFAULT_HEAP_SAMPLE_BYTES);

    let go_heap_sampling = match pick(
        cli.go_heap_sampling,
        fc.go_heap_sampling,
        "go-heap-sampling",
        "go_heap_sampling",
        path,
    ) {
        Some((raw, opt)) => raw
            .parse()
            .map_err(|()| invalid(&opt, &raw, "expected report or force"))?,
        None => GoHeapSampling::Report,
    };

    let block_rate = match pick(
        cli.block_rate,
        fc.block_rate,
        "block-rate",
        "block_rate",
        path,
    ) {
        Some((raw, opt)) => {
            let d = parse_duration(&raw, &opt)?;
            if d.is_zero() {
                return Err(invalid(&opt, raw, "the rate must be longer than 0s"));
            }
            d
        }
        None => DEFAULT_BLOCK_RATE,
    };

    let mutex_fraction = number(
        cli.mutex_fraction,
        fc.mutex_fraction,
        ("mutex-fraction", "mutex_fraction", path),
        1..=u64::MAX,
        "expected a whole number, at least 1",
    )?
    .unwrap_or(DEFAULT_MUTEX_FRACTION);

    let labels = merge_labels(&cli.labels, fc.labels, path)?;

    let unwind = match pick(cli.unwind, fc.unwind, "unwind", "unwind", path) {
        Some((raw, opt)) => raw
            .parse()
            .map_err(|()| invalid(&opt, &raw, "expected auto, fp or dwarf"))?,
        None => UnwindMode::Auto,
    };

    let retention = match pick(cli.retention, fc.retention, "retention", "retention", path) {
        Some((raw, opt)) => parse_retention(&raw, &opt, interval)?,
        None if DEFAULT_RETENTION > interval => Some(DEFAULT_RETENTION),
        // An interval of a day or more with no retention given: keep all
        // rather than refuse a setting the user did not make.
        None => None,
    };
    let push = match pick(cli.push_url, fc.push_url, "push-url", "push_url", path) {
        Some((raw, opt)) => Some(
            crate::config::push::build(&raw, fc.push.as_ref(), &labels, interval)
                .map_err(|e| sink_error(e, "push_url", &opt, path))?,
        ),
        None => None,
    };
    let otlp = match pick(
        cli.otlp_endpoint,
        fc.otlp_endpoint,
        "otlp-endpoint",
        "otlp_endpoint",
        path,
    ) {
        Some((raw, opt)) => Some(
            crate::config::otlp::build(&raw, fc.otlp.as_ref(), &labels)
                .map_err(|e| sink_error(e, "otlp_endpoint", &opt, path))?,
        ),
        None => None,
    };
    let address = |picked: Option<(String, String)>| -> Result<_, ConfigError> {
        match picked {
            Some((raw, opt)) => Ok(Some(raw.trim().parse().map_err(|_| {
                invalid(
                    &opt,
                    &raw,
                    "expected ADDRESS:PORT, like 127.0.0.1:9464 or [::]:9464",
                )
            })?)),
            None => Ok(None),
        }
    };
    let metrics_addr: Option<std::net::SocketAddr> = address(pick(
        cli.metrics_addr,
        fc.metrics_addr,
        "metrics-addr",
        "metrics_addr",
        path,
    ))?;
    let http_addr: Option<std::net::SocketAddr> = address(pick(
        cli.http_addr,
        fc.http_addr,
        "http-addr",
        "http_addr",
        path,
    ))?;
    // One server serves both: /metrics at either address.
    let (metrics_addr, http_addr) = match (metrics_addr, http_addr) {
        (Some(m), Some(h)) if m != h => {
            return Err(invalid(
                "--metrics-addr",
                m,
                format!("the same address as --http-addr ({h}), which serves /metrics too"),
            ));
        }
        (m, Some(h)) => (m.or(Some(h)), Some(h)),
        (m, None) => (m, None),
    };
    let http_token = match pick(
        cli.http_token_file,
        fc.http_token_file,
        "http-token-file",
        "http_token_file",
        path,
    ) {
        None => None,
        Some((file, opt)) if http_addr.is_none() => {
            return Err(invalid(
                &opt,
                file.display(),
                "only with --http-addr, whose requests it guards",
            ));
        }
        Some((file, opt)) => Some(
            crate::config::push::read_secret(&file)
                .map_err(|why| invalid(&opt, file.display(), why))?,
        ),
    };
    let http_metrics_without_token =
        cli.http_metrics_without_token || fc.http_metrics_without_token.unwrap_or(false);
    if http_metrics_without_token && http_token.is_none() {
        return Err(invalid(
            &origin(
                "http-metrics-without-token",
                "http_metrics_without_token",
                if cli.http_metrics_without_token {
                    None
                } else {
                    path
                },
            ),
            true,
            "only with --http-token-file (without a token, nothing asks for one)",
        ));
    }

    let limits = match &fc.limits {
        Some(table) => table.validate().map_err(|e| {
            invalid(
                &origin("", &format!("limits.{}", e.key), path),
                e.value,
                e.expected,
            )
        })?,
        None => MapLimits::default(),
    };
    let stack_switches = fc
        .debug
        .as_ref()
        .map(DebugTable::switches)
        .unwrap_or_default();
    let kernel_log = fc.debug.as_ref().is_some_and(DebugTable::kernel_log);

    Ok(Settings {
        pids,
        command,
        profiles,
        best_effort,
        check: cli.check,
        duration,
        interval,
        output_dir,
        cpu_frequency,
        heap_sample_bytes,
        go_heap_sampling,
        block_rate,
        mutex_fraction,
        labels,
        unwind,
        retention,
        push,
        otlp,
        metrics_addr,
        http_addr,
        http_token,
        http_metrics_without_token,
        limits,
        stack_switches,
        kernel_log,
    })
}

/// `off` or a zero duration: keep every file. Otherwise the retention must
/// be longer than the interval, or every profile would be deleted as soon
/// as it is written (its window started one interval ago).
pub(super) fn parse_retention(
    raw: &str,
    opt: &str,
    interval: Duration,
) -> Result<Option<Duration>, ConfigError> {
    if raw.trim() == "off" {
        return Ok(None);
    }
    let d = parse_duration(raw, opt)?;
    if d.is_zero() {
        return Ok(None);
    }
    if d <= interval {
        return Err(invalid(
            opt,
            raw,
            format!(
                "the retention must be longer than the interval ({}), or off",
                humantime::format_duration(interval)
            ),
        ));
    }
    Ok(Some(d))
}

/// The target: `--pid`s or a command. A target named on the command line
/// replaces the file's target as a whole (see the module doc).
pub(super) fn merge_target(
    cli: &Cli,
    fc: &FileConfig,
    path: Option<&Path>,
) -> Result<(Vec<u32>, Vec<OsString>), ConfigError> {
    let cli_has_target = !cli.pids.is_empty() || !cli.command.is_empty();
    let (raw_pids, command, pid_origin, from_file) = if cli_has_target {
        let raw: Vec<String> = cli.pids.clone();
        (raw, cli.command.clone(), origin("pid", "pid", None), None)
    } else {
        let raw = fc
            .pid
            .as_ref()
            .map(|p| p.0.iter().map(i64::to_string).collect())
            .unwrap_or_default();
        let command = fc
            .command
            .as_ref()
            .map(|c| c.iter().map(OsString::from).collect())
            .unwrap_or_default();
        (raw, command, origin("pid", "pid", path), path)
    };

    if !raw_pids.is_empty() && !command.is_empty() {
        return Err(ConfigError::PidWithCommand {
            config_file: from_file.map(Path::to_owned),
        });
    }
    if command.first().is_some_and(|program| program.is_empty()) {
        let opt = match from_file {
            Some(p) => format!("'command' in config file {}", p.display()),
            None => "-- COMMAND".to_owned(),
        };
        return Err(invalid(&opt, "", "expected a program to run"));
    }

    let mut pids = Vec::with_capacity(raw_pids.len());
    for raw in &raw_pids {
        let pid = parse_pid(raw, &pid_origin)?;
        let tgid = process_tgid(pid, &pid_origin)?;
        if !pids.contains(&tgid) {
            pids.push(tgid);
        }
    }
    Ok((pids, command))
}

pub(super) fn parse_pid(raw: &str, opt: &str) -> Result<u32, ConfigError> {
    match raw.trim().parse::<u32>() {
        Ok(pid) if pid > 0 => Ok(pid),
        _ => Err(invalid(
            opt,
            raw,
            "expected a process ID (a positive integer)",
        )),
    }
}

/// The thread-group id of `pid`, which must exist. A thread id is accepted
/// and mapped to its process rather than refused: /proc resolves thread ids
/// too, tools like `top -H` show them, and the kernel filter works on whole
/// processes, so a tid can only mean "the process of this thread".
pub(super) fn process_tgid(pid: u32, opt: &str) -> Result<u32, ConfigError> {
    // Lossy: the Name line holds the process's own name, which need not be UTF-8.
    let status = match crate::model::text::read_proc_text(format!("/proc/{pid}/status")) {
        Ok(status) => status,
        // ESRCH: it exited between the open and the read.
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => {
            return Err(ConfigError::NoSuchProcess {
                pid,
                option: opt.to_owned(),
            });
        }
        Err(e) => {
            return Err(ConfigError::ProcessLookup {
                pid,
                option: opt.to_owned(),
                reason: io_reason(&e),
            });
        }
    };
    let tgid = status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse::<u32>().ok())
        .ok_or_else(|| ConfigError::ProcessLookup {
            pid,
            option: opt.to_owned(),
            reason: "no Tgid in /proc status".to_owned(),
        })?;
    if tgid != pid {
        tracing::info!(
            tid = pid,
            pid = tgid,
            "thread {pid} belongs to process {tgid}; profiling process {tgid}"
        );
    }
    Ok(tgid)
}

/// The profile types asked for, and those of them asked for at best
/// effort (a trailing `?`).
pub(super) fn merge_profiles(
    cli: Vec<String>,
    file: Option<ProfileList>,
    path: Option<&Path>,
) -> Result<(Vec<ProfileKind>, Vec<ProfileKind>), ConfigError> {
    let cli = (!cli.is_empty()).then_some(cli);
    let Some((names, opt)) = pick(cli, file.map(|f| f.0), "profiles", "profiles", path) else {
        return Ok((vec![ProfileKind::Cpu], vec![]));
    };
    let mut profiles = Vec::new();
    let mut best_effort = Vec::new();
    for name in &names {
        let name = name.trim();
        let (bare, optional) = match name.strip_suffix('?') {
            Some(bare) => (bare, true),
            None => (name, false),
        };
        let kind: ProfileKind = bare.parse().map_err(|_| {
            invalid(
                &opt,
                name,
                "expected a comma list of cpu, heap, block, mutex, offcpu (each may end in '?')",
            )
        })?;
        if !profiles.contains(&kind) {
            profiles.push(kind);
            if optional {
                best_effort.push(kind);
            }
        } else if !optional {
            // Asked for plainly once: required.
            best_effort.retain(|&k| k != kind);
        }
    }
    if profiles.is_empty() {
        return Err(invalid(&opt, "", "expected at least one profile type"));
    }
    Ok((profiles, best_effort))
}

/// A numeric setting from a flag (a string) or the file (a TOML integer),
/// checked against `range`.
pub(super) fn number(
    flag_value: Option<String>,
    file_value: Option<u64>,
    (flag, key, path): (&str, &str, Option<&Path>),
    range: std::ops::RangeInclusive<u64>,
    expected: &str,
) -> Result<Option<u64>, ConfigError> {
    let value = match (flag_value, file_value) {
        (Some(raw), _) => {
            let opt = origin(flag, key, None);
            let v = raw
                .trim()
                .parse::<u64>()
                .map_err(|_| invalid(&opt, &raw, expected))?;
            (v, opt)
        }
        (None, Some(v)) => (v, origin(flag, key, path)),
        (None, None) => return Ok(None),
    };
    let (v, opt) = value;
    if !range.contains(&v) {
        return Err(invalid(&opt, v, expected));
    }
    Ok(Some(v))
}

pub(super) fn parse_duration(raw: &str, opt: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(raw.trim()).map_err(|_| invalid(opt, raw, DURATION_EXPECTED))
}

/// File labels first (sorted by key, as a TOML table has no useful order),
/// then `--label`s in order; a flag replaces a file label with the same key.
pub(super) fn merge_labels(
    flags: &[String],
    file: Option<BTreeMap<String, String>>,
    path: Option<&Path>,
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut labels = Vec::new();
    if let Some(table) = file {
        let opt = origin("label", "labels", path);
        for (key, value) in table {
            check_label(&key, &value, &format!("{key} = \"{value}\""), &opt)?;
            labels.push((key, value));
        }
    }
    let file_count = labels.len();
    for raw in flags {
        let Some((key, value)) = raw.split_once('=') else {
            return Err(invalid("--label", raw, "expected KEY=VALUE"));
        };
        check_label(key, value, raw, "--label")?;
        if let Some(i) = labels.iter().position(|(k, _)| k == key) {
            if i >= file_count {
                return Err(invalid(
                    "--label",
                    raw,
                    format!("label '{key}' is given more than once"),
                ));
            }
            labels[i].1 = value.to_owned();
        } else {
            labels.push((key.to_owned(), value.to_owned()));
        }
    }
    Ok(labels)
}

pub(super) fn check_label(key: &str, value: &str, raw: &str, opt: &str) -> Result<(), ConfigError> {
    let mut chars = key.chars();
    let valid_name = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if !valid_name {
        return Err(invalid(
            opt,
            raw,
            "the label name must start with a letter or '_' and contain only letters, \
             digits, '_', '.' and '-'",
        ));
    }
    if RESERVED_LABELS.contains(&key) {
        return Err(invalid(
            opt,
            raw,
            format!(
                "'{key}' is set by profilerd itself (reserved: {})",
                RESERVED_LABELS.join(", ")
            ),
        ));
    }
    // An empty value is almost always an unset shell variable (`env=$ENV`).
    if value.is_empty() {
        return Err(invalid(
            opt,
            raw,
            format!("label '{key}' has an empty value"),
        ));
    }
    Ok(())
}
