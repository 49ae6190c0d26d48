//! `profilerd`: parses the command line, sets up logging and runs the
//! session, or reports on profile files (`top`, `flamegraph`). Every
//! failure ends in one line on stderr and a non-zero exit.

use std::process::ExitCode;

use profilerd::config::{ConfigError, Settings};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    profilerd::own_heap::configure();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // `profilerd top|flamegraph ...` read profiles; anything else runs the daemon.
    if let Some(code) = profilerd::report::dispatch(&args) {
        return code;
    }
    let settings = match Settings::parse_from(args) {
        Ok(s) => s,
        Err(ConfigError::Help(text)) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("profilerd: {e}");
            return ExitCode::from(2);
        }
    };
    // PROFILERD_LOG (or RUST_LOG) selects log levels; info by default.
    let mut filter = std::env::var("PROFILERD_LOG")
        .ok()
        .and_then(|v| EnvFilter::try_new(v).ok())
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    if settings.kernel_log {
        // `[debug] kernel_log`: the kernel's lines are shown whatever the level.
        filter = filter.add_directive(
            format!("{}=debug", profilerd::bpf::log::TARGET)
                .parse()
                .expect("a valid directive"),
        );
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();

    if settings.check {
        return profilerd::bpf::check::run_check(&settings);
    }
    raise_open_file_limit();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("profilerd: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(profilerd::session::run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("profilerd: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line. Library errors often include their
/// cause in their own message too; a cause already said is not repeated.
fn one_line(error: &anyhow::Error) -> String {
    let mut line = error.to_string();
    for cause in error.chain().skip(1) {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
    }
    line.replace('\n', " ")
}

/// The symbolizer keeps a handle on every mapped file it may need after the
/// process exits; the soft limit of 1024 would cap that early.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0
        && limit.rlim_cur < limit.rlim_max
    {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: valid pointer; raising the soft limit up to the hard one is always allowed.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_are_not_repeated() {
        let io = std::io::Error::from_raw_os_error(2);
        let e = anyhow::Error::new(profilerd::output::writer::WriteError::CreateDir {
            dir: "/proc/nope".into(),
            source: io,
        });
        let e = e.context("starting");
        assert_eq!(
            one_line(&e),
            "starting: cannot create output directory /proc/nope: No such file or directory (os error 2)"
        );
    }
}
