//! Reading profiles on the node, without Go: `profilerd top FILE...`
//! (pprof's `-top` table) and `profilerd flamegraph FILE... -o OUT.svg`.
//! This module owns their command lines and errors; [`stacks`] reads and
//! merges the files, [`top`] and [`flamegraph`] present them, [`units`]
//! formats values as pprof does.

pub mod flamegraph;
#[cfg(test)]
mod properties;
pub mod stacks;
pub mod top;
pub mod units;

use std::ffi::OsString;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;

/// The subcommands' names, as the first argument of `profilerd`.
pub const SUBCOMMANDS: [&str; 2] = ["top", "flamegraph"];

/// Why a report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// `--help`: not a failure; the text goes to stdout.
    #[error("{0}")]
    Help(String),
    /// The command line does not fit the grammar.
    #[error("{0}")]
    Usage(String),
    #[error("unknown sample type '{name}' (this profile has: {available})")]
    UnknownSampleType { name: String, available: String },
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("not a pprof profile: {}: {reason}", path.display())]
    NotPprof { path: PathBuf, reason: String },
    #[error("corrupt profile {}: {what}", path.display())]
    Corrupt { path: PathBuf, what: String },
    #[error(
        "cannot merge {} ({this}) with {} ({first})",
        path.display(),
        first_path.display()
    )]
    Incompatible {
        path: PathBuf,
        this: String,
        first_path: PathBuf,
        first: String,
    },
    #[error("no samples of type {sample_type} in the {files} file(s) given")]
    NoSamples { sample_type: String, files: usize },
    #[error("cannot draw the flame graph: {0}")]
    Render(io::Error),
    #[error("cannot write {}: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
}

impl ReportError {
    /// 0 for help, 2 for command-line mistakes, 1 for files that cannot be
    /// read, merged or written.
    pub fn exit_code(&self) -> u8 {
        match self {
            ReportError::Help(_) => 0,
            ReportError::Usage(_) | ReportError::UnknownSampleType { .. } => 2,
            _ => 1,
        }
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "profilerd top",
    about = "Print the functions with the largest values, like `go tool pprof -top`",
    override_usage = "profilerd top [OPTIONS] FILE..."
)]
struct TopCli {
    /// pprof files (gzipped or not); files of one profile type are summed
    #[arg(value_name = "FILE", required = true)]
    files: Vec<PathBuf>,

    /// Sample type to show, by name or index (pprof's -sample_index)
    /// [default: the profile's default, else its last]
    #[arg(long, visible_alias = "sample-index", value_name = "NAME")]
    sample_type: Option<String>,

    /// How many rows to print; 0 prints all
    #[arg(
        short = 'n',
        long = "nodecount",
        value_name = "N",
        default_value_t = 20
    )]
    nodecount: usize,

    /// Sort by cumulative value instead of flat value
    #[arg(long)]
    cum: bool,
}

#[derive(Debug, Parser)]
#[command(
    name = "profilerd flamegraph",
    about = "Write a flame graph (SVG) of the files' stacks",
    override_usage = "profilerd flamegraph [OPTIONS] -o OUT.svg FILE..."
)]
struct FlamegraphCli {
    /// pprof files (gzipped or not); files of one profile type are summed
    #[arg(value_name = "FILE", required = true)]
    files: Vec<PathBuf>,

    /// Where to write the SVG: a new or regular file, replaced atomically,
    /// or - for standard output
    #[arg(short = 'o', long = "output", value_name = "OUT.svg", required = true)]
    output: PathBuf,

    /// Sample type to draw, by name or index (pprof's -sample_index)
    /// [default: the profile's default, else its last]
    #[arg(long, visible_alias = "sample-index", value_name = "NAME")]
    sample_type: Option<String>,
}

/// Runs `profilerd top|flamegraph ...` when `args[1]` names one of them
/// and returns its exit code; `None` leaves `args` to the daemon.
pub fn dispatch(args: &[OsString]) -> Option<ExitCode> {
    let name = args.get(1)?.to_str()?;
    if !SUBCOMMANDS.contains(&name) {
        return None;
    }
    let result = match name {
        "top" => run_top(args),
        _ => run_flamegraph(args),
    };
    Some(match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(ReportError::Help(text)) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            let line = e.to_string().replace('\n', " ");
            eprintln!("profilerd {name}: {line}");
            ExitCode::from(e.exit_code())
        }
    })
}

/// The subcommand's arguments with "profilerd NAME" as the program name.
fn sub_args(args: &[OsString]) -> impl Iterator<Item = OsString> + '_ {
    let name = args.get(1).map(|n| n.to_string_lossy().into_owned());
    std::iter::once(OsString::from(format!(
        "profilerd {}",
        name.unwrap_or_default()
    )))
    .chain(args.iter().skip(2).cloned())
}

fn run_top(args: &[OsString]) -> Result<(), ReportError> {
    let cli = TopCli::try_parse_from(sub_args(args)).map_err(|e| from_clap(e, "top"))?;
    let stacks = stacks::load(&cli.files, cli.sample_type.as_deref())?;
    let order = if cli.cum {
        top::Order::Cum
    } else {
        top::Order::Flat
    };
    let text = top::render(&stacks, order, cli.nodecount);
    to_stdout(text.as_bytes())
}

fn to_stdout(bytes: &[u8]) -> Result<(), ReportError> {
    let mut stdout = io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        // `profilerd top ... | head` closing the pipe is not a failure.
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(ReportError::Write {
            path: "standard output".into(),
            source: e,
        }),
        _ => Ok(()),
    }
}

fn run_flamegraph(args: &[OsString]) -> Result<(), ReportError> {
    let cli =
        FlamegraphCli::try_parse_from(sub_args(args)).map_err(|e| from_clap(e, "flamegraph"))?;
    let stacks = stacks::load(&cli.files, cli.sample_type.as_deref())?;
    let svg = flamegraph::render(&stacks)?;
    if cli.output.as_os_str() == "-" {
        return to_stdout(&svg);
    }
    flamegraph::write_atomically(&cli.output, &svg)
}

/// clap's error as one line, or the help text.
fn from_clap(err: clap::Error, name: &str) -> ReportError {
    match err.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => ReportError::Help(err.to_string()),
        kind => {
            // "error: MESSAGE" and its continuation lines (such as the
            // missing arguments), up to the blank line before the usage.
            let rendered = err.render().to_string();
            let message: Vec<&str> = rendered
                .lines()
                .map(str::trim)
                .skip_while(|l| l.is_empty())
                .take_while(|l| !l.is_empty())
                .collect();
            let message = message.join(" ");
            let message = message.strip_prefix("error:").unwrap_or(&message).trim();
            let message = if message.is_empty() {
                kind.to_string()
            } else {
                message.to_owned()
            };
            ReportError::Usage(format!("{message} (see 'profilerd {name} --help')"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn only_the_subcommand_names_dispatch() {
        assert!(dispatch(&args(&["profilerd"])).is_none());
        assert!(dispatch(&args(&["profilerd", "--pid", "1"])).is_none());
        assert!(dispatch(&args(&["profilerd", "--", "top"])).is_none());
        assert!(dispatch(&args(&["profilerd", "topp"])).is_none());
    }

    #[test]
    fn usage_errors() {
        let e = run_top(&args(&["profilerd", "top"])).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("<FILE>"), "{e}");
        assert!(!e.to_string().contains('\n'));
        let e = run_flamegraph(&args(&["profilerd", "flamegraph", "x.pb.gz"])).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--output"), "{e}");
        assert!(
            e.to_string().contains("'profilerd flamegraph --help'"),
            "{e}"
        );
        let e = run_top(&args(&["profilerd", "top", "-n", "x", "f"])).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        match run_top(&args(&["profilerd", "top", "--help"])) {
            Err(ReportError::Help(text)) => {
                assert!(text.contains("Usage: profilerd top"), "{text}");
                assert!(text.contains("--sample-type"), "{text}");
            }
            other => panic!("{other:?}"),
        }
    }
}
