//! `cargo xtask vm`: runs a command, or the profile-type smoke, inside QEMU
//! on the LTS kernels fleets run (Debian's 6.1 and 6.12 cloud kernels), so
//! that what profilerd does there can be seen from any machine. This module
//! owns the command line, what the VM needs installed and the order of the
//! steps; the kernels, the initramfs, the boot, the console protocol and
//! the smoke each have their own module.

mod console;
mod costs;
mod initramfs;
mod kernel;
mod qemu;
mod smoke;
mod suite;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;

use console::Markers;
use kernel::Kernel;

#[derive(Args)]
pub struct VmArgs {
    /// The kernel to boot: 6.1 or 6.12; for --smoke also `host` (this
    /// machine's kernel, no VM), and every kernel then the host's when
    /// omitted.
    #[arg(long)]
    kernel: Option<String>,
    /// Run each profile type system-wide for a few seconds over a static
    /// workload and report what profilerd did (exit 1 unless each type
    /// did what `profilerd --check` said: wrote samples where it said
    /// ready or degraded, was refused where it said unavailable).
    #[arg(long)]
    smoke: bool,
    /// Run the end-to-end tests of the VM suite (a representative subset
    /// of every test file) inside the VM: on --kernel, else on 6.1 and
    /// 6.12 (exit 1 unless all pass; tables in target/vm/tests.md).
    #[arg(long)]
    tests: bool,
    /// Time malloc+free pairs and futex and condition-variable round trips
    /// bare and under each profile type's mechanism, inside the VM (on
    /// --kernel, else on 6.1 and 6.12); tables in target/vm/costs.md.
    #[arg(long)]
    costs: bool,
    /// With --tests, only the tests whose `file::name` holds FILTER
    /// (repeatable).
    #[arg(long = "test", value_name = "FILTER", requires = "tests")]
    filters: Vec<String>,
    /// How long each profile type runs in the smoke.
    #[arg(long, default_value_t = 3, value_name = "SECONDS")]
    seconds: u32,
    /// Deadline for one boot, from starting QEMU to its power-off (default
    /// 300 s, 1500 s with --tests).
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<u64>,
    /// Also show the whole serial console (kernel messages) on stderr.
    #[arg(long)]
    console: bool,
    /// The command to run in the VM, with its arguments (profilerd and
    /// busybox are on the PATH, the static workloads in /workloads).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    command: Vec<String>,
}

/// Runs `cargo xtask vm`. A command's exit status becomes the task's.
pub fn run(root: &Path, args: VmArgs) -> Result<()> {
    if args.costs {
        if args.smoke || args.tests || !args.command.is_empty() {
            bail!("--costs runs its own command; drop --smoke, --tests and the command");
        }
        let kernels = match args.kernel.as_deref() {
            Some(name) => vec![kernel::by_name(name)?],
            None => kernel::KERNELS.to_vec(),
        };
        return costs_all(root, &kernels, &args);
    }
    if args.tests {
        if args.smoke || !args.command.is_empty() {
            bail!("--tests runs its own command; drop --smoke and the command");
        }
        let kernels = match args.kernel.as_deref() {
            Some(name) => vec![kernel::by_name(name)?],
            None => kernel::KERNELS.to_vec(),
        };
        return tests_all(root, &kernels, &args);
    }
    if args.smoke {
        if !args.command.is_empty() {
            bail!(
                "--smoke runs its own command; drop {:?}",
                args.command.join(" ")
            );
        }
        let targets = match args.kernel.as_deref() {
            Some(HOST) => vec![Target::Host],
            Some(name) => vec![Target::Vm(kernel::by_name(name)?)],
            None => all_targets(),
        };
        return smoke_all(root, &targets, &args);
    }
    let Some(name) = &args.kernel else {
        bail!("name the kernel: --kernel 6.1 or --kernel 6.12");
    };
    let kernel = kernel::by_name(name)?;
    if args.command.is_empty() {
        bail!("give a command to run in the VM (after --), or --smoke");
    }
    prepare()?;
    let fetched = kernel.fetch(root)?;
    let workloads = initramfs::build_workloads(root)?;
    let outcome = boot(
        root,
        &kernel,
        &fetched,
        &workloads,
        &Payload {
            command: &console::shell_command(&args.command),
            ..Payload::default()
        },
        &args,
        true,
    )?;
    eprintln!(
        "Linux {}: exit status {} (booted in {:.1} s, {:.1} s in all)",
        kernel.name,
        outcome.finished.status,
        outcome.boot.as_secs_f64(),
        outcome.total.as_secs_f64()
    );
    std::process::exit(outcome.finished.status.clamp(0, 255));
}

/// `--kernel host`: the smoke on this machine's kernel, without a VM.
const HOST: &str = "host";

/// Where a smoke runs.
enum Target {
    Vm(Kernel),
    Host,
}

/// Every kernel of the matrix, then the host's for comparison.
fn all_targets() -> Vec<Target> {
    let mut targets: Vec<Target> = kernel::KERNELS.iter().copied().map(Target::Vm).collect();
    targets.push(Target::Host);
    targets
}

/// The matrix for `cargo xtask test`: the smoke on every kernel.
pub fn matrix(root: &Path) -> Result<()> {
    let args = VmArgs {
        kernel: None,
        smoke: true,
        costs: false,
        tests: false,
        filters: Vec::new(),
        seconds: 3,
        timeout: None,
        console: false,
        command: Vec::new(),
    };
    smoke_all(root, &all_targets(), &args)
}

/// The VM suite on every kernel of the matrix, for `cargo xtask test`.
pub fn tests_matrix(root: &Path) -> Result<()> {
    let args = VmArgs {
        kernel: None,
        smoke: false,
        costs: false,
        tests: true,
        filters: Vec::new(),
        seconds: 3,
        timeout: None,
        console: false,
        command: Vec::new(),
    };
    tests_all(root, kernel::KERNELS, &args)
}

/// Deadline of a boot that runs the VM suite: its tests take about 10 min
/// under TCG.
const TESTS_TIMEOUT_S: u64 = 1500;

/// The VM suite on each kernel, a table each (also written to
/// `target/vm/tests.md`); fails after the last if any test failed.
fn tests_all(root: &Path, kernels: &[Kernel], args: &VmArgs) -> Result<()> {
    prepare()?;
    let tests = suite::chosen(&args.filters)?;
    let prepared = suite::prepare(root, &tests)?;
    let script = [("/vm-tests.sh".to_string(), prepared.script.clone())];
    let payload = Payload {
        command: "sh /vm-tests.sh",
        scripts: &script,
        files: &prepared.files,
    };
    on_each_kernel(
        root,
        kernels,
        args,
        "tests",
        &payload,
        Together::Yes,
        |kernel, outcome, log| {
            let results = suite::parse(&outcome.finished.output);
            let mut section = format!(
                "Linux {} ({} {}): booted in {:.1} s, tests {:.1} s in all\nlog: {}\n\n{}\n",
                kernel.name,
                kernel.package,
                kernel.version,
                outcome.boot.as_secs_f64(),
                outcome.total.as_secs_f64(),
                log.display(),
                suite::table(&results)
            );
            let failed = suite::failures(&tests, &results);
            for test in failed.iter().chain(&suite::retried(&results)) {
                if let Some(excerpt) = suite::failure_excerpt(&outcome.finished.output, test) {
                    section.push_str(&format!(
                        "{test} on {}:\n\n```\n{excerpt}\n```\n\n",
                        kernel.name
                    ));
                }
            }
            (section, failed)
        },
    )
    .context("end-to-end tests in the VMs failed")
}

/// The cost comparison on each kernel, a table each (also written to
/// `target/vm/costs.md`); fails if a setup reported nothing.
fn costs_all(root: &Path, kernels: &[Kernel], args: &VmArgs) -> Result<()> {
    prepare()?;
    let (files, script) = costs::prepare(root)?;
    let script = [("/vm-costs.sh".to_string(), script)];
    let payload = Payload {
        command: "sh /vm-costs.sh",
        scripts: &script,
        files: &files,
    };
    on_each_kernel(
        root,
        kernels,
        args,
        "costs",
        &payload,
        // Timings: each VM has the machine to itself, as the figures of
        // docs/BENCHMARKS.md were taken.
        Together::No,
        |kernel, outcome, log| {
            let measured = costs::parse(&outcome.finished.output);
            let section = format!(
                "Linux {} ({} {}), QEMU TCG, kernel.bpf_stats_enabled=1\nlog: {}\n\n{}\n",
                kernel.name,
                kernel.package,
                kernel.version,
                log.display(),
                costs::table(&measured)
            );
            let missing = costs::missing(&measured)
                .into_iter()
                .map(String::from)
                .collect();
            (section, missing)
        },
    )
    .context("setups without figures")
}

/// Whether the VMs of one task boot at once or one after the other.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Together {
    /// At once, a thread each: each VM has one TCG vCPU, so two VMs keep
    /// two host cores busy and the task takes as long as its slowest
    /// kernel instead of the sum.
    Yes,
    /// One after the other (benchmarks, whose figures assume a VM alone).
    No,
}

/// Boots each kernel with `payload`, keeps its output in
/// `target/vm/WHAT-KERNEL.log` and asks `judge` for the report's section of
/// it and what failed; prints the sections in the kernels' order, writes
/// them all to `target/vm/WHAT.md`, and fails after the last kernel if
/// anything failed.
fn on_each_kernel(
    root: &Path,
    kernels: &[Kernel],
    args: &VmArgs,
    what: &str,
    payload: &Payload,
    together: Together,
    judge: impl Fn(&Kernel, &qemu::Outcome, &Path) -> (String, Vec<String>),
) -> Result<()> {
    let vms = fetch_all(root, kernels)?;
    let workloads = initramfs::build_workloads(root)?;
    let outcomes = boot_all(root, &vms, &workloads, payload, args, together);
    let mut failing = Vec::new();
    let mut report = String::new();
    let mut errors = Vec::new();
    for ((kernel, _), outcome) in vms.iter().zip(outcomes) {
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        let log = root.join(format!("target/vm/{what}-{}.log", kernel.name));
        fs::write(&log, &outcome.finished.output)
            .with_context(|| format!("writing {}", log.display()))?;
        let (section, failed) = judge(kernel, &outcome, &log);
        print!("\n{section}");
        report.push_str(&section);
        if !failed.is_empty() {
            failing.push(format!("{}: {}", kernel.name, failed.join(", ")));
        }
    }
    // A VM that did not finish leaves no report, as when the boots ran one
    // after the other and the first such one ended the task.
    joined(errors)?;
    let path = root.join(format!("target/vm/{what}.md"));
    fs::write(&path, &report).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("tables in {}", path.display());
    if !failing.is_empty() {
        bail!("{}", failing.join("; "));
    }
    Ok(())
}

/// Each kernel fetched, one after the other: a first fetch runs apt-get,
/// whose lock two at once would contend for.
fn fetch_all(root: &Path, kernels: &[Kernel]) -> Result<Vec<(Kernel, kernel::Fetched)>> {
    kernels
        .iter()
        .map(|kernel| Ok((*kernel, kernel.fetch(root)?)))
        .collect()
}

/// Boots each of `vms` with `payload` (at once, a thread each, or one
/// after the other) and returns their outcomes in the same order. Each
/// boot has its own scratch directory, initramfs and console markers, and
/// QEMU is given no disk, network, socket or shared directory, so that
/// two boots share nothing but the read-only kernel images and workloads.
fn boot_all(
    root: &Path,
    vms: &[(Kernel, kernel::Fetched)],
    workloads: &[PathBuf],
    payload: &Payload,
    args: &VmArgs,
    together: Together,
) -> Vec<Result<qemu::Outcome>> {
    each(vms, together, |(kernel, fetched)| {
        // Its errors name the kernel (`Linux 6.1: ...`).
        boot(root, kernel, fetched, workloads, payload, args, false)
    })
}

/// `f` of each item, at once (a thread each) or one after the other, the
/// results in the items' order.
fn each<T: Sync, R: Send>(
    items: &[T],
    together: Together,
    f: impl Fn(&T) -> Result<R> + Sync,
) -> Vec<Result<R>> {
    if together == Together::No || items.len() < 2 {
        return items.iter().map(&f).collect();
    }
    let f = &f;
    std::thread::scope(|scope| {
        let threads: Vec<_> = items
            .iter()
            .map(|item| scope.spawn(move || f(item)))
            .collect();
        threads
            .into_iter()
            .enumerate()
            .map(|(i, thread)| {
                thread
                    .join()
                    .unwrap_or_else(|_| Err(anyhow!("the thread of item {i} panicked")))
            })
            .collect()
    })
}

/// Ok when `errors` is empty; else the one error, or every error's
/// message on one line.
fn joined(errors: Vec<anyhow::Error>) -> Result<()> {
    let mut errors = errors.into_iter();
    let Some(first) = errors.next() else {
        return Ok(());
    };
    let rest: Vec<String> = errors.map(|e| format!("{e:#}")).collect();
    if rest.is_empty() {
        return Err(first);
    }
    bail!("{first:#}; {}", rest.join("; "))
}

/// The smoke on each target, a table each (also written to
/// `target/vm/matrix.md`); fails after the last if any profile type did not
/// write samples on any of them. The VMs boot at once; the host's smoke
/// runs after them, so that its system-wide profilerd neither probes the
/// QEMU processes nor takes their cores.
fn smoke_all(root: &Path, targets: &[Target], args: &VmArgs) -> Result<()> {
    prepare()?;
    let script = smoke::script(args.seconds);
    let scripts = [("/smoke.sh".to_string(), script.clone())];
    let payload = Payload {
        command: "sh /smoke.sh",
        scripts: &scripts,
        files: &[],
    };
    let kernels: Vec<Kernel> = targets
        .iter()
        .filter_map(|t| match t {
            Target::Vm(kernel) => Some(*kernel),
            Target::Host => None,
        })
        .collect();
    let vms = fetch_all(root, &kernels)?;
    let workloads = initramfs::build_workloads(root)?;
    let mut booted = boot_all(root, &vms, &workloads, &payload, args, Together::Yes)
        .into_iter()
        .zip(&vms);
    // What each target left, in the targets' order: (name, output, exit
    // status, heading).
    let mut ran = Vec::new();
    let mut errors = Vec::new();
    for target in targets {
        match target {
            Target::Vm(kernel) => {
                let (outcome, (_, fetched)) = booted
                    .next()
                    .context("a boot for every kernel of the targets")?;
                let outcome = match outcome {
                    Ok(outcome) => outcome,
                    Err(e) => {
                        errors.push(e);
                        continue;
                    }
                };
                let heading = format!(
                    "Linux {} ({} {}): booted in {:.1} s, smoke {:.1} s in all\n{}",
                    kernel.name,
                    kernel.package,
                    kernel.version,
                    outcome.boot.as_secs_f64(),
                    outcome.total.as_secs_f64(),
                    config_summary(fetched)?
                );
                let finished = outcome.finished;
                ran.push((kernel.name, finished.output, finished.status, heading));
            }
            Target::Host => {
                let started = Instant::now();
                let (output, status) = smoke_on_host(root, &script)?;
                let release = crate::output(Command::new("uname").arg("-r")).unwrap_or_default();
                let heading = format!(
                    "host (Linux {}): smoke {:.1} s in all",
                    release.trim(),
                    started.elapsed().as_secs_f64()
                );
                ran.push((HOST, output, status, heading));
            }
        }
    }
    let mut failing = Vec::new();
    let mut report = String::new();
    for (name, output, status, heading) in ran {
        let log = root.join(format!("target/vm/smoke-{name}.log"));
        fs::write(&log, &output).with_context(|| format!("writing {}", log.display()))?;
        let results = smoke::parse(&output);
        let check = match smoke::parse_check(&output) {
            Some((text, exit)) => format!(
                "`profilerd --check` (exit {}):\n\n```\n{text}```\n\n",
                exit.map_or("?".to_string(), |e| e.to_string())
            ),
            None => String::new(),
        };
        let section = format!(
            "{heading}\nlog: {}\n\n{}\n{check}",
            log.display(),
            smoke::table(&results)
        );
        print!("\n{section}");
        report.push_str(&section);
        // The matrix holds profilerd to what `--check` says of the kernel:
        // every type it calls ready runs, every type it refuses is refused;
        // and on these kernels none may be refused.
        let states = smoke::parse_check(&output)
            .map(|(text, _)| smoke::check_states(&text))
            .unwrap_or_default();
        let mut wrong = smoke::disagreements(&results, &states);
        wrong.extend(smoke::unavailable(&states));
        if !wrong.is_empty() || status != 0 {
            failing.push(format!("{name}: {}", wrong.join(", ")));
        }
    }
    // A VM that did not finish leaves no report, as when the boots ran one
    // after the other and the first such one ended the task.
    joined(errors)?;
    let path = root.join("target/vm/matrix.md");
    fs::write(&path, &report).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("tables in {}", path.display());
    if !failing.is_empty() {
        bail!("kernel matrix: {}", failing.join("; "));
    }
    Ok(())
}

/// Runs the smoke script here, with the same profilerd and static workload
/// as in the VM, in a scratch directory; its output and exit status.
fn smoke_on_host(root: &Path, script: &str) -> Result<(String, i32)> {
    initramfs::build_workloads(root)?;
    let vm_dir = root.join("target/vm");
    let scratch = tempfile::Builder::new()
        .prefix("smoke-")
        .tempdir_in(&vm_dir)
        .context("creating a scratch directory")?;
    let path = std::env::join_paths(
        [root.join("target/release"), vm_dir.join("workloads")]
            .into_iter()
            .chain(std::env::split_paths(
                &std::env::var_os("PATH").unwrap_or_default(),
            )),
    )?;
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(scratch.path())
        .env("PATH", path)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("running the smoke on the host")?;
    Ok((
        String::from_utf8_lossy(&out.stdout).into_owned(),
        out.status.code().unwrap_or(1),
    ))
}

/// What every boot needs: the VM's tools installed and profilerd built.
fn prepare() -> Result<()> {
    crate::setup(false)?;
    setup()?;
    crate::build(true)
}

/// Installs what the VM needs, if missing: QEMU, static busybox, cpio, and
/// the static C library for the workloads.
fn setup() -> Result<()> {
    let mut packages = Vec::new();
    if !crate::have(qemu::QEMU) {
        packages.push("qemu-system-x86");
    }
    // Debian's `busybox` package is dynamically linked; the VM has no C
    // library for it.
    if !Path::new(initramfs::BUSYBOX).exists()
        || !initramfs::is_static(Path::new(initramfs::BUSYBOX))
    {
        packages.push("busybox-static");
    }
    if !crate::have("cpio") {
        packages.push("cpio");
    }
    if !Path::new("/usr/lib/x86_64-linux-gnu/libc.a").exists() {
        packages.push("libc6-dev");
    }
    crate::apt_install(&packages)
}

/// What a boot runs besides profilerd and the static workloads.
#[derive(Default)]
struct Payload<'a> {
    /// The shell command line init runs.
    command: &'a str,
    /// Scripts: path in the VM, text.
    scripts: &'a [(String, String)],
    /// Files: path here, path in the VM (with their shared libraries).
    files: &'a [(PathBuf, PathBuf)],
}

/// Boots `kernel` with `payload` and the static `workloads` (built
/// beforehand, once for every boot) in the initramfs; the temporary files
/// are gone when it returns.
fn boot(
    root: &Path,
    kernel: &Kernel,
    fetched: &kernel::Fetched,
    workloads: &[PathBuf],
    payload: &Payload,
    args: &VmArgs,
    echo_output: bool,
) -> Result<qemu::Outcome> {
    let Payload {
        command,
        scripts,
        files,
    } = *payload;
    let vm_dir = root.join("target/vm");
    fs::create_dir_all(&vm_dir)?;
    let scratch = tempfile::Builder::new()
        .prefix("boot-")
        .tempdir_in(&vm_dir)
        .context("creating a scratch directory")?;
    let initrd: PathBuf = scratch.path().join("initrd.cpio");
    let markers = Markers::fresh();
    let profilerd = root.join("target/release/profilerd");
    let size = initramfs::build(
        &initramfs::Contents {
            profilerd: &profilerd,
            workloads,
            scripts,
            files,
            command,
        },
        &markers,
        scratch.path(),
        &initrd,
    )?;
    let label = format!("Linux {}", kernel.name);
    let timeout = Duration::from_secs(args.timeout.unwrap_or(if args.tests || args.costs {
        TESTS_TIMEOUT_S
    } else {
        300
    }));
    eprintln!(
        "booting {label} under TCG (initramfs {:.1} MiB, timeout {} s)",
        size as f64 / (1 << 20) as f64,
        timeout.as_secs()
    );
    qemu::run(
        &qemu::Boot {
            label: &label,
            vmlinuz: &fetched.vmlinuz,
            initrd: &initrd,
            timeout,
            echo_output,
            echo_console: args.console,
        },
        &markers,
    )
}

/// The kernel's settings of the options profilerd relies on, on one line.
fn config_summary(fetched: &kernel::Fetched) -> Result<String> {
    let config = fs::read_to_string(&fetched.config)
        .with_context(|| format!("reading {}", fetched.config.display()))?;
    let options = kernel::config_options(&config, kernel::PROFILER_OPTIONS);
    Ok(options
        .iter()
        .map(|(name, value)| format!("{}={value}", name.trim_start_matches("CONFIG_")))
        .collect::<Vec<_>>()
        .join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn together_runs_at_once_and_keeps_the_order() {
        // The first waits for the second: only at once can both finish.
        let (tx, rx) = mpsc::channel();
        let rx = std::sync::Mutex::new(rx);
        let got = each(&[0, 1], Together::Yes, |&i| {
            if i == 0 {
                let rx = rx.lock().map_err(|_| anyhow!("poisoned"))?;
                rx.recv_timeout(Duration::from_secs(30))?;
            } else {
                tx.send(())?;
            }
            Ok(i * 10)
        });
        let got: Vec<i32> = got.into_iter().map(|r| r.unwrap()).collect();
        assert_eq!(got, [0, 10]);
    }

    #[test]
    fn one_after_the_other_keeps_the_order_and_each_error() {
        let got = each(&[1, 2, 3], Together::No, |&i| {
            if i == 2 { bail!("two failed") } else { Ok(i) }
        });
        assert_eq!(got[0].as_ref().unwrap(), &1);
        assert_eq!(got[1].as_ref().unwrap_err().to_string(), "two failed");
        assert_eq!(got[2].as_ref().unwrap(), &3);
    }

    #[test]
    fn errors_are_joined_in_order() {
        assert!(joined(Vec::new()).is_ok());
        let one = joined(vec![anyhow!("a").context("Linux 6.1")]).unwrap_err();
        assert_eq!(format!("{one:#}"), "Linux 6.1: a");
        let two = joined(vec![anyhow!("a"), anyhow!("b").context("Linux 6.12")]).unwrap_err();
        assert_eq!(two.to_string(), "a; Linux 6.12: b");
    }
}
