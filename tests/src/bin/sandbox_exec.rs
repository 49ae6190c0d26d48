//! `sandbox_exec [OPTION]... -- PROGRAM [ARG]...`: sets the process
//! properties and installs the seccomp filters that systemd sets up for a
//! unit's sandbox just before it execs the service, then execs PROGRAM.
//! tests/tests/deploy.rs runs the daemon under it with the settings of
//! deploy/profilerd.service (see profiler_tests::sandbox).
//!
//! Each setting is one filter of its own, installed in the order systemd
//! installs them, the allow list last; for a system call that several
//! filters refuse, the kernel returns the errno of the newest. Every filter
//! kills the process on a system call of a foreign architecture.
//!
//! Options (lists are comma-separated):
//!   --umask OCTAL, --nice N
//!   --deny LABEL=NAMES            NAMES refused with EPERM (a filter each)
//!   --hostname                    sethostname/setdomainname refused
//!   --address-families FAMILIES   socket(2) of any other family: EAFNOSUPPORT
//!   --memory-deny-write-execute   PR_SET_MDWE where the kernel has it, and
//!                                 the seccomp rules of systemd
//!   --restrict-realtime, --restrict-suid-sgid, --restrict-namespaces
//!   --native-arch                 SystemCallArchitectures=native
//!   --lock-personality
//!   --allow NAMES --errno N       the allow list; anything else returns N
//!   --probe                       before the exec, a child tries calls the
//!                                 filters refuse and prints one line each:
//!                                 `sandbox_exec probe NAME: RESULT`
//!
//! System-call names this architecture does not have (seccompiler's table)
//! are skipped, as systemd skips names libseccomp cannot resolve; they are
//! printed on one line.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// linux/shm.h: execute access to a shared memory segment.
const SHM_EXEC: u64 = 0o100000;
/// linux/personality.h.
const PER_LINUX: u64 = 0;
const PER_LINUX32: u64 = 0x0008;
const PER_MASK: i32 = 0xff;
/// The namespace flags of clone(2), unshare(2) and setns(2) that
/// RestrictNamespaces= covers (systemd's list: cgroup ipc net mnt pid user
/// uts).
const NAMESPACE_FLAGS: [(&str, i32); 7] = [
    ("cgroup", libc::CLONE_NEWCGROUP),
    ("ipc", libc::CLONE_NEWIPC),
    ("net", libc::CLONE_NEWNET),
    ("mnt", libc::CLONE_NEWNS),
    ("pid", libc::CLONE_NEWPID),
    ("user", libc::CLONE_NEWUSER),
    ("uts", libc::CLONE_NEWUTS),
];

#[derive(Default)]
struct Options {
    umask: Option<libc::mode_t>,
    nice: Option<i32>,
    deny: Vec<(String, Vec<String>)>,
    hostname: bool,
    address_families: Option<Vec<String>>,
    mdwe: bool,
    restrict_realtime: bool,
    restrict_suid_sgid: bool,
    restrict_namespaces: bool,
    native_arch: bool,
    lock_personality: bool,
    allow: Option<Vec<String>>,
    errno: Option<u32>,
    probe: bool,
    command: Vec<OsString>,
}

fn main() -> ExitCode {
    // run() returns only on failure: on success it has exec'd.
    let Err(e) = run();
    eprintln!("sandbox_exec: {e}");
    ExitCode::from(127)
}

fn run() -> Result<Infallible, String> {
    let opts = parse(std::env::args_os().skip(1).collect())?;
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| format!("no seccomp filters for {}: {e}", std::env::consts::ARCH))?;
    // Process properties first, as systemd sets them before the filters.
    if let Some(mask) = opts.umask {
        // SAFETY: umask(2) has no memory effects.
        unsafe { libc::umask(mask) };
    }
    if let Some(nice) = opts.nice {
        // SAFETY: plain system call on this process.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } != 0 {
            return Err(format!("setpriority({nice}): {}", last_error()));
        }
    }

    let mut skipped = Vec::new();
    let mut filters: Vec<(String, BpfProgram)> = Vec::new();
    if opts.hostname {
        let names = ["sethostname".to_owned(), "setdomainname".to_owned()];
        if let Some(f) = deny_filter("hostname", &names, libc::EPERM, arch, &mut skipped)? {
            filters.push(("hostname".into(), f));
        }
    }
    if let Some(families) = &opts.address_families {
        filters.push(("address families".into(), address_families(families, arch)?));
    }
    if opts.mdwe {
        // Newer systemd uses the kernel's own switch (6.3 and later) and
        // falls back to seccomp; both are applied here.
        // SAFETY: prctl with integer arguments.
        let rc = unsafe {
            libc::prctl(
                libc::PR_SET_MDWE,
                libc::PR_MDWE_REFUSE_EXEC_GAIN as libc::c_ulong,
                0,
                0,
                0,
            )
        };
        if rc != 0 {
            eprintln!(
                "sandbox_exec: PR_SET_MDWE not available ({}), seccomp rules only",
                last_error()
            );
        }
        filters.push(("memory deny write execute".into(), mdwe(arch)?));
    }
    if opts.restrict_realtime {
        filters.push(("realtime".into(), realtime(arch)?));
    }
    if opts.restrict_suid_sgid {
        filters.push(("suid sgid".into(), suid_sgid(arch)?));
    }
    if opts.restrict_namespaces {
        let (flags, clone3) = namespaces(arch)?;
        filters.push(("namespaces".into(), flags));
        filters.push(("clone3".into(), clone3));
    }
    for (label, names) in &opts.deny {
        if let Some(f) = deny_filter(label, names, libc::EPERM, arch, &mut skipped)? {
            filters.push((label.clone(), f));
        }
    }
    if opts.native_arch {
        // No rules: only the architecture check every filter starts with.
        let filter = SeccompFilter::new(
            BTreeMap::new(),
            SeccompAction::Allow,
            SeccompAction::KillProcess,
            arch,
        )
        .map_err(|e| format!("architecture filter: {e}"))?;
        filters.push(("architectures".into(), compile(filter, "architectures")?));
    }
    if opts.lock_personality {
        filters.push(("personality".into(), personality(arch)?));
    }
    if let Some(names) = &opts.allow {
        let errno = opts.errno.unwrap_or(libc::EPERM as u32);
        filters.push((
            "allow list".into(),
            allow_list(names, errno, arch, &mut skipped)?,
        ));
    }
    skipped.sort();
    skipped.dedup();
    eprintln!(
        "sandbox_exec: {} filters; names not on {}: {}",
        filters.len(),
        std::env::consts::ARCH,
        if skipped.is_empty() {
            "none".to_owned()
        } else {
            skipped.join(" ")
        }
    );
    for (label, program) in &filters {
        seccompiler::apply_filter(program)
            .map_err(|e| format!("installing the {label} filter: {e}"))?;
    }
    if opts.probe {
        probe_in_child()?;
    }
    let (program, args) = opts.command.split_first().ok_or("no command after --")?;
    let e = Command::new(program).args(args).exec();
    Err(format!("exec {}: {e}", program.to_string_lossy()))
}

fn parse(args: Vec<OsString>) -> Result<Options, String> {
    let mut opts = Options::default();
    let mut it = args.into_iter();
    let list = |v: String| {
        v.split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    while let Some(arg) = it.next() {
        let arg = arg
            .into_string()
            .map_err(|a| format!("option {a:?} is not UTF-8"))?;
        let mut value = || -> Result<String, String> {
            it.next()
                .and_then(|v| v.into_string().ok())
                .ok_or(format!("{arg} needs a UTF-8 value"))
        };
        match arg.as_str() {
            "--" => {
                opts.command = it.collect();
                break;
            }
            "--umask" => {
                let v = value()?;
                opts.umask = Some(
                    libc::mode_t::from_str_radix(&v, 8).map_err(|e| format!("--umask {v}: {e}"))?,
                );
            }
            "--nice" => {
                let v = value()?;
                opts.nice = Some(v.parse().map_err(|e| format!("--nice {v}: {e}"))?);
            }
            "--errno" => {
                let v = value()?;
                opts.errno = Some(v.parse().map_err(|e| format!("--errno {v}: {e}"))?);
            }
            "--deny" => {
                let v = value()?;
                let (label, names) = v
                    .split_once('=')
                    .ok_or(format!("--deny {v}: expected LABEL=NAMES"))?;
                opts.deny.push((label.to_owned(), list(names.to_owned())));
            }
            "--address-families" => opts.address_families = Some(list(value()?)),
            "--allow" => opts.allow = Some(list(value()?)),
            "--hostname" => opts.hostname = true,
            "--memory-deny-write-execute" => opts.mdwe = true,
            "--restrict-realtime" => opts.restrict_realtime = true,
            "--restrict-suid-sgid" => opts.restrict_suid_sgid = true,
            "--restrict-namespaces" => opts.restrict_namespaces = true,
            "--native-arch" => opts.native_arch = true,
            "--lock-personality" => opts.lock_personality = true,
            "--probe" => opts.probe = true,
            other => return Err(format!("unknown option {other}")),
        }
    }
    if opts.command.is_empty() {
        return Err("usage: sandbox_exec [OPTION]... -- PROGRAM [ARG]...".into());
    }
    Ok(opts)
}

fn last_error() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn compile(filter: SeccompFilter, label: &str) -> Result<BpfProgram, String> {
    filter
        .try_into()
        .map_err(|e| format!("compiling the {label} filter: {e}"))
}

/// Argument `index` (its low 32 bits: every value compared is an int or
/// flags) against `value`.
fn arg(index: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, String> {
    SeccompCondition::new(index, SeccompCmpArgLen::Dword, op, value)
        .map_err(|e| format!("condition on argument {index}: {e}"))
}

/// Argument `index` has every bit of `bits` set.
fn has_bits(index: u8, bits: u64) -> Result<SeccompCondition, String> {
    arg(index, SeccompCmpOp::MaskedEq(bits), bits)
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, String> {
    SeccompRule::new(conditions).map_err(|e| format!("rule: {e}"))
}

/// A filter that returns `errno` for the calls matching `rules` (syscall
/// number, and-ed conditions; no conditions: every call) and allows the
/// rest.
fn refusing(
    label: &str,
    rules: Vec<(libc::c_long, Vec<SeccompCondition>)>,
    errno: i32,
    arch: TargetArch,
) -> Result<BpfProgram, String> {
    let mut map: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (nr, conditions) in rules {
        let chain = map.entry(nr).or_default();
        // An unconditional rule is an empty chain in seccompiler.
        if !conditions.is_empty() {
            chain.push(rule(conditions)?);
        }
    }
    let filter = SeccompFilter::new(
        map,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch,
    )
    .map_err(|e| format!("{label} filter: {e}"))?;
    compile(filter, label)
}

/// Whether seccompiler's table for `arch` has `name`: its JSON front end is
/// the only way to it by name.
fn known(name: &str, arch: TargetArch) -> bool {
    let errno = serde_json::json!({ "errno": 1 });
    names_program(&[name], &errno, &serde_json::json!("allow"), arch).is_ok()
}

/// A filter over whole system calls by name: `matched` for `names`,
/// `mismatched` for the rest.
fn names_program(
    names: &[&str],
    mismatched: &serde_json::Value,
    matched: &serde_json::Value,
    arch: TargetArch,
) -> Result<BpfProgram, String> {
    let rules: Vec<serde_json::Value> = names
        .iter()
        .map(|n| serde_json::json!({ "syscall": n }))
        .collect();
    let json = serde_json::json!({
        "f": { "mismatch_action": mismatched, "match_action": matched, "filter": rules }
    });
    seccompiler::compile_from_json(json.to_string().as_bytes(), arch)
        .map_err(|e| e.to_string())?
        .remove("f")
        .ok_or_else(|| "seccompiler returned no filter".to_owned())
}

/// The known ones of `names`; the others are added to `skipped`.
fn known_names<'a>(
    names: &'a [String],
    arch: TargetArch,
    skipped: &mut Vec<String>,
) -> Vec<&'a str> {
    let (known, unknown): (Vec<&String>, Vec<&String>) = names.iter().partition(|n| known(n, arch));
    skipped.extend(unknown.into_iter().cloned());
    known.into_iter().map(String::as_str).collect()
}

/// `names` refused with `errno`, everything else allowed; None when this
/// architecture has none of them.
fn deny_filter(
    label: &str,
    names: &[String],
    errno: i32,
    arch: TargetArch,
    skipped: &mut Vec<String>,
) -> Result<Option<BpfProgram>, String> {
    let names = known_names(names, arch, skipped);
    if names.is_empty() {
        return Ok(None);
    }
    let errno = serde_json::json!({ "errno": errno });
    names_program(&names, &serde_json::json!("allow"), &errno, arch)
        .map(Some)
        .map_err(|e| format!("{label} filter: {e}"))
}

/// SystemCallFilter= as an allow list: `names` allowed, the rest `errno`.
fn allow_list(
    names: &[String],
    errno: u32,
    arch: TargetArch,
    skipped: &mut Vec<String>,
) -> Result<BpfProgram, String> {
    let names = known_names(names, arch, skipped);
    let errno = serde_json::json!({ "errno": errno });
    names_program(&names, &errno, &serde_json::json!("allow"), arch)
        .map_err(|e| format!("allow list: {e}"))
}

fn family(name: &str) -> Result<u64, String> {
    let af = match name {
        "AF_UNIX" | "AF_LOCAL" => libc::AF_UNIX,
        "AF_INET" => libc::AF_INET,
        "AF_INET6" => libc::AF_INET6,
        "AF_NETLINK" => libc::AF_NETLINK,
        "AF_PACKET" => libc::AF_PACKET,
        "AF_VSOCK" => libc::AF_VSOCK,
        other => {
            return Err(format!(
                "address family {other} is not in this launcher's table"
            ));
        }
    };
    Ok(af as u64)
}

/// RestrictAddressFamilies= as an allow list: socket(2) with any other
/// family returns EAFNOSUPPORT (socketpair(2) and passed sockets are not
/// covered, as with systemd).
fn address_families(families: &[String], arch: TargetArch) -> Result<BpfProgram, String> {
    let conditions = families
        .iter()
        .map(|f| arg(0, SeccompCmpOp::Ne, family(f)?))
        .collect::<Result<Vec<_>, String>>()?;
    refusing(
        "address families",
        vec![(libc::SYS_socket, conditions)],
        libc::EAFNOSUPPORT,
        arch,
    )
}

/// MemoryDenyWriteExecute='s seccomp rules: mappings both writable and
/// executable, mprotect(2)/pkey_mprotect(2) to executable, shmat(2) with
/// SHM_EXEC.
fn mdwe(arch: TargetArch) -> Result<BpfProgram, String> {
    let (w, x) = (libc::PROT_WRITE as u64, libc::PROT_EXEC as u64);
    refusing(
        "memory deny write execute",
        vec![
            (libc::SYS_mmap, vec![has_bits(2, w | x)?]),
            (libc::SYS_mprotect, vec![has_bits(2, x)?]),
            (libc::SYS_pkey_mprotect, vec![has_bits(2, x)?]),
            (libc::SYS_shmat, vec![has_bits(2, SHM_EXEC)?]),
        ],
        libc::EPERM,
        arch,
    )
}

/// RestrictRealtime=: sched_setscheduler(2) to any policy but SCHED_OTHER,
/// SCHED_BATCH and SCHED_IDLE (systemd's rule; sched_setattr(2) passes its
/// policy behind a pointer and is left to the kernel's own checks).
fn realtime(arch: TargetArch) -> Result<BpfProgram, String> {
    let allowed = [libc::SCHED_OTHER, libc::SCHED_BATCH, libc::SCHED_IDLE];
    let highest = *allowed.iter().max().unwrap_or(&0) as u64;
    let mut rules = Vec::new();
    for policy in 0..highest {
        if !allowed.contains(&(policy as i32)) {
            rules.push((
                libc::SYS_sched_setscheduler,
                vec![arg(1, SeccompCmpOp::Eq, policy)?],
            ));
        }
    }
    rules.push((
        libc::SYS_sched_setscheduler,
        vec![arg(1, SeccompCmpOp::Gt, highest)?],
    ));
    refusing("realtime", rules, libc::EPERM, arch)
}

/// RestrictSUIDSGID=: every call that sets S_ISUID or S_ISGID on a new or
/// existing file (systemd's list), and openat2(2), whose mode it cannot see.
fn suid_sgid(arch: TargetArch) -> Result<BpfProgram, String> {
    let creat = libc::O_CREAT as u64;
    let mut rules = Vec::new();
    for bit in [libc::S_ISUID as u64, libc::S_ISGID as u64] {
        rules.extend([
            (libc::SYS_fchmod, vec![has_bits(1, bit)?]),
            (libc::SYS_fchmodat, vec![has_bits(2, bit)?]),
            (libc::SYS_fchmodat2, vec![has_bits(2, bit)?]),
            (libc::SYS_mkdirat, vec![has_bits(2, bit)?]),
            (libc::SYS_mknodat, vec![has_bits(2, bit)?]),
            (
                libc::SYS_openat,
                vec![has_bits(2, creat)?, has_bits(3, bit)?],
            ),
        ]);
        #[cfg(target_arch = "x86_64")]
        rules.extend([
            (libc::SYS_chmod, vec![has_bits(1, bit)?]),
            (libc::SYS_mkdir, vec![has_bits(1, bit)?]),
            (libc::SYS_mknod, vec![has_bits(1, bit)?]),
            (libc::SYS_open, vec![has_bits(1, creat)?, has_bits(2, bit)?]),
            (libc::SYS_creat, vec![has_bits(1, bit)?]),
        ]);
    }
    rules.push((libc::SYS_openat2, vec![]));
    refusing("suid sgid", rules, libc::EPERM, arch)
}

/// RestrictNamespaces=yes: clone(2) and unshare(2) with any namespace flag
/// and every setns(2) refused; clone3(2), whose flags are behind a pointer,
/// returns ENOSYS so that libc falls back to clone(2).
fn namespaces(arch: TargetArch) -> Result<(BpfProgram, BpfProgram), String> {
    let mut rules = vec![(libc::SYS_setns, vec![])];
    for (_, flag) in NAMESPACE_FLAGS {
        rules.push((libc::SYS_unshare, vec![has_bits(0, flag as u64)?]));
        rules.push((libc::SYS_clone, vec![has_bits(0, flag as u64)?]));
    }
    let flags = refusing("namespaces", rules, libc::EPERM, arch)?;
    let clone3 = refusing(
        "clone3",
        vec![(libc::SYS_clone3, vec![])],
        libc::ENOSYS,
        arch,
    )?;
    Ok((flags, clone3))
}

/// LockPersonality=: personality(2) only with the personality in force
/// (systemd's choice: PER_LINUX32 if that is it, else PER_LINUX).
fn personality(arch: TargetArch) -> Result<BpfProgram, String> {
    // SAFETY: 0xffffffff only queries.
    let current = unsafe { libc::personality(0xffff_ffff) };
    let locked = if current & PER_MASK == PER_LINUX32 as i32 {
        PER_LINUX32
    } else {
        PER_LINUX
    };
    refusing(
        "personality",
        vec![(
            libc::SYS_personality,
            vec![arg(0, SeccompCmpOp::Ne, locked)?],
        )],
        libc::EPERM,
        arch,
    )
}

/// Runs the probes in a child (some, were they allowed, would change the
/// process) and waits for it.
fn probe_in_child() -> Result<(), String> {
    // SAFETY: single-threaded here; the child only makes system calls,
    // writes to stderr and _exits.
    match unsafe { libc::fork() } {
        -1 => Err(format!("fork for the probes: {}", last_error())),
        0 => {
            probes();
            // SAFETY: ends the child without running the parent's exit code.
            unsafe { libc::_exit(0) }
        }
        child => {
            let mut status = 0;
            // SAFETY: waits for our own child.
            if unsafe { libc::waitpid(child, &mut status, 0) } != child {
                return Err(format!("waiting for the probes: {}", last_error()));
            }
            if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
                return Err(format!("the probe child ended with status {status:#x}"));
            }
            Ok(())
        }
    }
}

fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EBADF => "EBADF",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EINVAL => "EINVAL",
        libc::ENOSYS => "ENOSYS",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::EPROTONOSUPPORT => "EPROTONOSUPPORT",
        libc::ENOSPC => "ENOSPC",
        other => return format!("errno {other}"),
    };
    name.to_owned()
}

/// "ok" for a call that returned `rc` >= 0, else its errno's name.
fn outcome(rc: libc::c_long) -> String {
    if rc >= 0 {
        "ok".to_owned()
    } else {
        errno_name(last_error().raw_os_error().unwrap_or(0))
    }
}

fn report(name: &str, result: &str) {
    eprintln!("sandbox_exec probe {name}: {result}");
}

/// Calls each filter must refuse, with arguments for which the kernel
/// itself would answer differently where there are such (a bad descriptor,
/// a missing path, an invalid value), so that the errno shows who refused.
fn probes() {
    let path = c"/nonexistent-sandbox-probe/x";
    // SAFETY (every block below): system calls with valid or deliberately
    // invalid arguments that the kernel checks; nothing they return is
    // dereferenced, and a descriptor that opens is closed.
    let socket = |family: i32, kind: i32| {
        let fd = unsafe { libc::socket(family, kind, 0) };
        if fd >= 0 {
            unsafe { libc::close(fd) };
        }
        outcome(fd as libc::c_long)
    };
    report("socket(AF_INET)", &socket(libc::AF_INET, libc::SOCK_DGRAM));
    report(
        "socket(AF_PACKET)",
        &socket(libc::AF_PACKET, libc::SOCK_RAW),
    );
    report(
        "socket(AF_NETLINK)",
        &socket(libc::AF_NETLINK, libc::SOCK_RAW),
    );
    report("setns(-1, 0)", &outcome(unsafe { libc::setns(-1, 0) } as _));
    // The kernel refuses CLONE_NEWUSER with CLONE_FS (EINVAL).
    let clone = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_NEWUSER | libc::CLONE_FS | libc::SIGCHLD) as libc::c_ulong,
            0,
            0,
            0,
            0,
        )
    };
    if clone == 0 {
        unsafe { libc::_exit(0) };
    }
    report("clone(CLONE_NEWUSER)", &outcome(clone));
    // A null argument: EINVAL from the kernel.
    let clone3 = unsafe { libc::syscall(libc::SYS_clone3, 0, 0) };
    report("clone3", &outcome(clone3));
    report(
        "unshare(CLONE_NEWNET)",
        &outcome(unsafe { libc::unshare(libc::CLONE_NEWNET) } as _),
    );
    report(
        "unshare(CLONE_NEWUSER)",
        &outcome(unsafe { libc::unshare(libc::CLONE_NEWUSER) } as _),
    );
    // Priority 0 is invalid for SCHED_FIFO: EINVAL from the kernel.
    let param = libc::sched_param { sched_priority: 0 };
    report(
        "sched_setscheduler(SCHED_FIFO)",
        &outcome(unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } as _),
    );
    report("sched_setattr(SCHED_FIFO)", &sched_setattr_fifo());
    report(
        "fchmod(S_ISUID)",
        &outcome(unsafe { libc::fchmod(-1, libc::S_ISUID) } as _),
    );
    report(
        "fchmodat(S_ISGID)",
        &outcome(unsafe { libc::fchmodat(libc::AT_FDCWD, path.as_ptr(), libc::S_ISGID, 0) } as _),
    );
    report(
        "openat(O_CREAT, S_ISUID)",
        &outcome(unsafe {
            libc::openat(
                libc::AT_FDCWD,
                path.as_ptr(),
                libc::O_CREAT | libc::O_WRONLY,
                libc::S_ISUID | 0o755,
            )
        } as _),
    );
    report(
        "mkdirat(S_ISGID)",
        &outcome(
            unsafe { libc::mkdirat(libc::AT_FDCWD, path.as_ptr(), libc::S_ISGID | 0o755) } as _,
        ),
    );
    report("mmap(PROT_WRITE|PROT_EXEC)", &mmap_probe());
    report("mprotect(+PROT_EXEC)", &mprotect_probe());
    report(
        "shmat(SHM_EXEC)",
        &outcome(unsafe { libc::shmat(-1, std::ptr::null(), SHM_EXEC as i32) } as libc::c_long),
    );
    let mdwe = unsafe { libc::prctl(libc::PR_GET_MDWE, 0, 0, 0, 0) };
    report(
        "prctl(PR_GET_MDWE)",
        &if mdwe >= 0 {
            format!("ok {mdwe}")
        } else {
            outcome(-1)
        },
    );
    report(
        "personality(current)",
        &outcome(unsafe { libc::personality(PER_LINUX as libc::c_ulong) } as _),
    );
    report(
        "personality(PER_LINUX32)",
        &outcome(unsafe { libc::personality(PER_LINUX32 as libc::c_ulong) } as _),
    );
    // A null time: EFAULT from the kernel.
    report(
        "clock_settime",
        &outcome(unsafe { libc::syscall(libc::SYS_clock_settime, libc::CLOCK_REALTIME, 0) }),
    );
    report(
        "init_module",
        &outcome(unsafe { libc::syscall(libc::SYS_init_module, 0, 0, c"".as_ptr()) }),
    );
    #[cfg(target_arch = "x86_64")]
    report(
        "ioperm",
        &outcome(unsafe { libc::syscall(libc::SYS_ioperm, 0, 1, 1) }),
    );
    report(
        "sethostname",
        &outcome(unsafe { libc::sethostname(c"probe".as_ptr(), 5) } as _),
    );
    // SYSLOG_ACTION_SIZE_BUFFER succeeds with CAP_SYSLOG: only an allow
    // list without syslog refuses it.
    report(
        "syslog(SIZE_BUFFER)",
        &outcome(unsafe { libc::syscall(libc::SYS_syslog, 10, 0, 0) }),
    );
    #[cfg(target_arch = "x86_64")]
    {
        // x32's numbers carry bit 30; this kernel may not have the ABI.
        report(
            "x32 getpid",
            &outcome(unsafe { libc::syscall(0x4000_0000 | libc::SYS_getpid) }),
        );
        report("i386 int 0x80", &i386_probe());
    }
}

fn sched_setattr_fifo() -> String {
    // struct sched_attr (linux/sched/types.h), first version: 48 bytes.
    #[repr(C)]
    struct SchedAttr {
        size: u32,
        policy: u32,
        flags: u64,
        nice: i32,
        priority: u32,
        runtime: u64,
        deadline: u64,
        period: u64,
    }
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_FIFO as u32,
        flags: 0,
        nice: 0,
        priority: 1,
        runtime: 0,
        deadline: 0,
        period: 0,
    };
    // SAFETY: a valid, initialized attribute of the size it states.
    outcome(unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) })
}

fn mmap_probe() -> String {
    // SAFETY: an anonymous mapping, unmapped if it is made.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_WRITE | libc::PROT_EXEC,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return outcome(-1);
    }
    // SAFETY: the mapping made just above.
    unsafe { libc::munmap(p, 4096) };
    "ok".to_owned()
}

fn mprotect_probe() -> String {
    // SAFETY: an anonymous read-write mapping of our own, then unmapped.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return format!("mmap failed: {}", outcome(-1));
        }
        let result = outcome(libc::mprotect(p, 4096, libc::PROT_READ | libc::PROT_EXEC) as _);
        libc::munmap(p, 4096);
        result
    }
}

/// A 32-bit system call (getpid through int 0x80) in a grandchild: a
/// filter for the native architecture only kills it with SIGSYS.
#[cfg(target_arch = "x86_64")]
fn i386_probe() -> String {
    // SAFETY: the grandchild makes one system call and _exits.
    match unsafe { libc::fork() } {
        -1 => format!("fork failed: {}", outcome(-1)),
        0 => {
            // SAFETY: i386 getpid (20) takes no arguments; eax is clobbered.
            unsafe {
                std::arch::asm!("int 0x80", inlateout("eax") 20u32 => _, options(nostack));
                libc::_exit(0)
            }
        }
        child => {
            let mut status = 0;
            // SAFETY: waits for our own child.
            unsafe { libc::waitpid(child, &mut status, 0) };
            if libc::WIFSIGNALED(status) {
                match libc::WTERMSIG(status) {
                    libc::SIGSYS => "SIGSYS".to_owned(),
                    libc::SIGSEGV => "SIGSEGV".to_owned(),
                    other => format!("signal {other}"),
                }
            } else {
                "ok".to_owned()
            }
        }
    }
}
