//! The sandbox of `deploy/profilerd.service` applied to a daemon started by
//! a test, as systemd applies it (systemd is not PID 1 where the tests run):
//! every property of the unit's `[Service]` section is read from the file
//! and either applied, or named in the report with the reason it is not;
//! a property this module does not know fails the test.
//!
//! How each is applied, in the order systemd applies them:
//!
//! - MemoryMax=, CPUQuota=: a cgroup of the test's (v2, or the v1
//!   controllers of a hybrid host) with `memory.max`/`memory.limit_in_bytes`
//!   and a quota per 100 ms period, which the daemon is in from its start;
//! - LimitMEMLOCK=: `ulimit -l` while the capabilities are still there;
//! - a mount namespace (`unshare --mount`, private propagation) and a UTS
//!   namespace for ProtectHostname=, then, in it:
//!   StateDirectory= a bind mount that stays writable; PrivateDevices= a
//!   new /dev (tmpfs, nosuid, noexec, read-only) with only null, zero,
//!   full, random, urandom and tty, /dev/pts, /dev/ptmx, /dev/shm,
//!   /dev/mqueue and /dev/hugepages from the host, and systemd's symlinks;
//!   ProtectSystem=strict every other mount read-only but /dev, /proc and
//!   /sys; PrivateTmp= new /tmp and /var/tmp; ProtectHome= and
//!   ProtectKernelModules= /home, /root, /run/user and the module
//!   directories inaccessible (empty, mode 000, read-only);
//!   ProtectControlGroups= every mount under /sys/fs/cgroup read-only;
//!   ProtectProc= a new procfs with `hidepid=`;
//! - CapabilityBoundingSet=, AmbientCapabilities=, NoNewPrivileges=:
//!   `setpriv`, with the capabilities PrivateDevices=, ProtectClock= and
//!   ProtectKernelModules= take away also removed;
//! - UMask=, Nice= and every seccomp filter: tests/src/bin/sandbox_exec.rs,
//!   with the system-call sets as `systemd-analyze syscall-filter` expands
//!   them on this machine: SystemCallFilter= (plus @default, which systemd
//!   adds to an allow list) with SystemCallErrorNumber=,
//!   SystemCallArchitectures=, RestrictAddressFamilies=,
//!   RestrictNamespaces=, RestrictRealtime=, RestrictSUIDSGID=,
//!   LockPersonality=, MemoryDenyWriteExecute= (PR_SET_MDWE and the seccomp
//!   rules), and the filters that PrivateDevices= (@raw-io), ProtectClock=
//!   (@clock), ProtectKernelModules= (@module) and ProtectHostname=
//!   (sethostname, setdomainname) add.
//!
//! [`Sandbox::check_process`] then reads what is in force from the daemon's
//! /proc entries (seccomp mode and filter count, no-new-privs, umask, nice,
//! limits, namespaces, cgroups, every mount and its flags, the entries of
//! its /dev), and [`Sandbox::check_probes`] what the launcher's probe child
//! was refused: calls with arguments the kernel would answer differently,
//! so the errno shows that the filter refused them.
//!
//! Where this differs from systemd: calls outside the allow list get
//! SystemCallErrorNumber= whatever they are, as systemd 252 does (255 and
//! later return ENOSYS for calls it does not know); x32 call numbers get
//! the allow list's errno where libseccomp's filters kill (kernels without
//! the x32 ABI, such as this one, have none anyway); the device cgroup
//! programs of PrivateDevices= and ProtectClock= are not attached (named
//! in the report).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::cgroups::{CpuCgroup, MemoryCgroup, TestCgroups, bytes_of};
use crate::daemon::{kernel_at_least, workspace_root};
use crate::process::run_with_timeout;

/// The `[Service]` settings of deploy/profilerd.service, in order.
pub struct Unit {
    settings: Vec<(String, String)>,
}

impl Unit {
    pub fn read() -> Unit {
        let path = workspace_root().join("deploy/profilerd.service");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        Unit::parse(&text)
    }

    pub fn parse(text: &str) -> Unit {
        let mut section = "";
        let mut settings = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if line.starts_with('[') {
                section = line;
                continue;
            }
            if section == "[Service]" {
                let (key, value) = line
                    .split_once('=')
                    .unwrap_or_else(|| panic!("not a setting in [Service]: {line:?}"));
                settings.push((key.trim().to_owned(), value.trim().to_owned()));
            }
        }
        Unit { settings }
    }

    /// The value of `key`, which the unit sets at most once.
    pub fn get(&self, key: &str) -> Option<&str> {
        let values: Vec<&str> = self
            .settings
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect();
        assert!(
            values.len() <= 1,
            "deploy/profilerd.service sets {key}= {} times; this test reads one",
            values.len()
        );
        values.first().copied()
    }

    /// A boolean setting: true for `yes`, false when absent or `no`; any
    /// other value is one this test does not apply.
    pub fn yes(&self, key: &str) -> bool {
        match self.get(key) {
            None | Some("no") => false,
            Some("yes") => true,
            Some(other) => panic!("{key}={other}: this test applies only yes and no"),
        }
    }

    pub fn list(&self, key: &str) -> Vec<String> {
        self.get(key)
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    }

    fn keys(&self) -> BTreeSet<&str> {
        self.settings.iter().map(|(k, _)| k.as_str()).collect()
    }
}

/// Keys of the `[Service]` section that are no sandbox of the process, and
/// what, if anything, covers them here.
const SERVICE_MANAGER_KEYS: [(&str, &str); 8] = [
    ("Type", "READY=1 is read from NOTIFY_SOCKET"),
    (
        "NotifyAccess",
        "not exercised here: the service manager's check of who notifies",
    ),
    (
        "ExecStart",
        "the daemon runs with the test's flags, not the unit's config file",
    ),
    (
        "ConfigurationDirectory",
        "not exercised here: the test passes its settings as flags",
    ),
    (
        "Restart",
        "not exercised here: the service manager's restart policy",
    ),
    (
        "RestartSec",
        "not exercised here: the service manager's restart policy",
    ),
    (
        "TimeoutStopSec",
        "the daemon's last window and exit must take no longer",
    ),
    (
        "StateDirectoryMode",
        "the state directory is made with this mode",
    ),
];

/// Capabilities systemd removes from the bounding set for a setting.
const IMPLIED_CAPABILITY_REMOVALS: [(&str, &[&str]); 3] = [
    ("PrivateDevices", &["CAP_MKNOD", "CAP_SYS_RAWIO"]),
    ("ProtectClock", &["CAP_SYS_TIME", "CAP_WAKE_ALARM"]),
    ("ProtectKernelModules", &["CAP_SYS_MODULE"]),
];

/// The device nodes of a private /dev (systemd's list).
const PRIVATE_DEV_NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// The unit's sandbox, set up for one daemon run.
pub struct Sandbox {
    /// The directory holding the state directory and the copies of the
    /// binaries, in /var/lib like the unit's.
    _root: tempfile::TempDir,
    /// StateDirectory=: the daemon's output directory.
    pub state: PathBuf,
    /// NOTIFY_SOCKET, in /run as systemd's is.
    _run: tempfile::TempDir,
    pub notify_socket: PathBuf,
    bin: PathBuf,
    launcher: PathBuf,
    script: Vec<String>,
    unshare: Vec<&'static str>,
    launcher_args: Vec<String>,
    /// The bounding set the daemon runs with.
    pub caps: BTreeSet<String>,
    /// Every system call the allow list names, as expanded here.
    allowed: BTreeSet<String>,
    /// Lines of the report: what is applied and how, what is not and why.
    report: Vec<String>,
    umask: Option<u32>,
    nice: Option<i32>,
    memlock_unlimited: bool,
    /// How many filters the launcher installed.
    filters: Option<usize>,
    /// TimeoutStopSec=.
    pub stop_timeout: Option<Duration>,
    memory: Option<(MemoryCgroup, u64)>,
    cpu: Option<(CpuCgroup, u64)>,
    /// Mount points of the host at setup, (path, fstype).
    host_mounts: Vec<(String, String)>,
    inaccessible: Vec<PathBuf>,
    tmp_dirs: Vec<&'static str>,
    unit: Unit,
    // Declared last: dropped after everything that runs in them.
    cgroups: TestCgroups,
}

impl Sandbox {
    /// Sets up the sandbox of `unit` with the bounding set `caps` (the
    /// unit's); the daemon binary `bin` and the launcher are copied out of
    /// the paths the sandbox hides.
    pub fn new(unit: Unit, caps: &BTreeSet<String>, bin: &Path, launcher: &Path) -> Sandbox {
        let root = tempfile::Builder::new()
            .prefix("profilerd-e2e-")
            .tempdir_in("/var/lib")
            .expect("creating a directory in /var/lib");
        let run = tempfile::Builder::new()
            .prefix("profilerd-e2e-")
            .tempdir_in("/run")
            .expect("creating a directory in /run");
        let state = root.path().join("state");
        std::fs::create_dir(&state).expect("creating the state directory");
        let copy = |from: &Path, name: &str| {
            let to = root.path().join(name);
            std::fs::copy(from, &to)
                .unwrap_or_else(|e| panic!("copying {} to {}: {e}", from.display(), to.display()));
            to
        };
        let mut sandbox = Sandbox {
            bin: copy(bin, "profilerd"),
            launcher: copy(launcher, "sandbox_exec"),
            state,
            notify_socket: run.path().join("notify"),
            _root: root,
            _run: run,
            script: vec!["set -e".to_owned()],
            unshare: vec!["--mount", "--propagation", "private"],
            launcher_args: Vec::new(),
            caps: caps.clone(),
            allowed: BTreeSet::new(),
            report: Vec::new(),
            umask: None,
            nice: None,
            memlock_unlimited: false,
            filters: None,
            stop_timeout: None,
            memory: None,
            cpu: None,
            host_mounts: host_mounts(),
            inaccessible: Vec::new(),
            tmp_dirs: Vec::new(),
            unit,
            cgroups: TestCgroups::new(),
        };
        sandbox.apply();
        sandbox
    }

    fn note(&mut self, line: String) {
        self.report.push(line);
    }

    fn apply(&mut self) {
        let keys: BTreeSet<String> = self.unit.keys().into_iter().map(str::to_owned).collect();
        let handled = self.apply_resources()
            + self.apply_mounts()
            + self.apply_privileges()
            + self.apply_filters();
        let mut known: BTreeSet<&str> = handled.iter().map(String::as_str).collect();
        for (key, how) in SERVICE_MANAGER_KEYS {
            if keys.contains(key) {
                known.insert(key);
                let value = self.unit.get(key).unwrap_or_default().to_owned();
                self.note(format!("{key}={value}: {how}"));
            }
        }
        let unknown: Vec<&String> = keys
            .iter()
            .filter(|k| !known.contains(k.as_str()))
            .collect();
        assert!(
            unknown.is_empty(),
            "deploy/profilerd.service sets {unknown:?}, which this test does not apply: \
             add it to tests/src/sandbox.rs (applied, or named as not exercised and why)"
        );
        if let Some(stop) = self.unit.get("TimeoutStopSec") {
            let secs = stop
                .strip_suffix('s')
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("TimeoutStopSec={stop}: this test reads seconds (Ns)"));
            self.stop_timeout = Some(Duration::from_secs(secs));
        }
    }

    /// MemoryMax=, CPUQuota=, LimitMEMLOCK=.
    fn apply_resources(&mut self) -> Handled {
        let mut handled = Handled::default();
        if let Some(max) = self.unit.get("MemoryMax") {
            let limit = bytes_of(max);
            let (cgroup, procs) = MemoryCgroup::create(&mut self.cgroups, limit);
            self.script.push(format!("echo $$ > {}", procs.display()));
            self.note(format!(
                "MemoryMax={max}: the daemon in {} from its start",
                cgroup.dir().display()
            ));
            self.memory = Some((cgroup, limit));
            handled += "MemoryMax";
        }
        if let Some(quota) = self.unit.get("CPUQuota") {
            let percent: u64 = quota
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("CPUQuota={quota}: this test reads whole percents"));
            let (cgroup, procs) = CpuCgroup::create(&mut self.cgroups, percent);
            self.script.push(format!("echo $$ > {}", procs.display()));
            self.note(format!(
                "CPUQuota={quota}: the daemon in {} ({percent} ms per 100 ms) from its start",
                cgroup.dir.display()
            ));
            self.cpu = Some((cgroup, percent));
            handled += "CPUQuota";
        }
        if let Some(limit) = self.unit.get("LimitMEMLOCK") {
            assert_eq!(
                limit, "infinity",
                "LimitMEMLOCK={limit}: this test applies infinity"
            );
            if own_capability(CAP_SYS_RESOURCE) {
                self.script.push("ulimit -l unlimited".into());
                self.memlock_unlimited = true;
                self.note("LimitMEMLOCK=infinity: ulimit -l unlimited".into());
            } else {
                self.note(
                    "not exercised here: LimitMEMLOCK=infinity (root here lacks \
                     CAP_SYS_RESOURCE, which raising the hard limit needs; the daemon runs \
                     with the host's limit, which kernels since 5.11 do not charge BPF maps to)"
                        .into(),
                );
            }
            handled += "LimitMEMLOCK";
        }
        handled
    }

    /// The mount and UTS namespaces.
    fn apply_mounts(&mut self) -> Handled {
        let mut handled = Handled::default();
        let state = self.state.display().to_string();
        match self.unit.get("StateDirectory") {
            Some(_) => {
                let mode = self.unit.get("StateDirectoryMode").unwrap_or("0755");
                let mode = u32::from_str_radix(mode, 8).expect("an octal StateDirectoryMode");
                std::fs::set_permissions(&self.state, std::fs::Permissions::from_mode(mode))
                    .expect("setting the state directory's mode");
                self.script.push(format!("mount --bind {state} {state}"));
                self.note(format!(
                    "StateDirectory=: {state} (mode {mode:o}), the only writable path"
                ));
                handled += "StateDirectory";
            }
            None => panic!("the unit sets no StateDirectory=: where would profiles go?"),
        }
        if self.unit.yes("PrivateDevices") {
            self.private_dev();
            self.note(
                "PrivateDevices=yes: new read-only /dev with the API nodes only, \
                 @raw-io refused, CAP_MKNOD and CAP_SYS_RAWIO not in the bounding set"
                    .into(),
            );
            self.note(
                "not exercised here: DevicePolicy=closed of PrivateDevices= (a cgroup BPF \
                 device program systemd attaches; no other node exists in the private /dev \
                 and CAP_MKNOD is gone)"
                    .into(),
            );
            handled += "PrivateDevices";
        }
        match self.unit.get("ProtectSystem") {
            Some("strict") => {
                for (path, _) in self.host_mounts.clone() {
                    if !under_any(&path, &["/dev", "/proc", "/sys"]) {
                        self.script.push(format!("mount -o remount,bind,ro {path}"));
                    }
                }
                self.note(
                    "ProtectSystem=strict: every mount read-only but /dev, /proc, /sys".into(),
                );
                handled += "ProtectSystem";
            }
            None => {}
            Some(other) => panic!("ProtectSystem={other}: this test applies strict"),
        }
        if self.unit.yes("PrivateTmp") {
            for dir in ["/tmp", "/var/tmp"] {
                self.script.push(format!(
                    "mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs {dir}"
                ));
                self.tmp_dirs.push(dir);
            }
            self.note("PrivateTmp=yes: new empty /tmp and /var/tmp".into());
            handled += "PrivateTmp";
        }
        if self.unit.yes("ProtectHome") {
            for dir in ["/home", "/root", "/run/user"] {
                self.make_inaccessible(Path::new(dir));
            }
            self.note("ProtectHome=yes: /home, /root, /run/user inaccessible".into());
            handled += "ProtectHome";
        }
        if self.unit.yes("ProtectKernelModules") {
            for dir in ["/lib/modules", "/usr/lib/modules"] {
                self.make_inaccessible(Path::new(dir));
            }
            self.note(
                "ProtectKernelModules=yes: module directories inaccessible, @module refused, \
                 CAP_SYS_MODULE not in the bounding set"
                    .into(),
            );
            handled += "ProtectKernelModules";
        }
        if self.unit.yes("ProtectControlGroups") {
            for (path, _) in self.host_mounts.clone() {
                if under_any(&path, &["/sys/fs/cgroup"]) {
                    self.script.push(format!("mount -o remount,bind,ro {path}"));
                }
            }
            self.note("ProtectControlGroups=yes: /sys/fs/cgroup and its mounts read-only".into());
            handled += "ProtectControlGroups";
        }
        match self.unit.get("ProtectProc") {
            Some(value @ ("invisible" | "noaccess" | "ptraceable")) => {
                self.script.push(format!(
                    "mount -t proc -o nosuid,nodev,noexec,hidepid={value} proc /proc"
                ));
                self.note(format!(
                    "ProtectProc={value}: a new procfs with hidepid={value}"
                ));
                handled += "ProtectProc";
            }
            None => {}
            Some(other) => panic!("ProtectProc={other}: not applied by this test"),
        }
        if self.unit.yes("ProtectHostname") {
            self.unshare.push("--uts");
            self.launcher_args.push("--hostname".into());
            self.note(
                "ProtectHostname=yes: a UTS namespace, sethostname/setdomainname refused".into(),
            );
            handled += "ProtectHostname";
        }
        handled
    }

    /// systemd's private /dev, built on a tmpfs beside the state directory
    /// and moved onto /dev.
    fn private_dev(&mut self) {
        let stage = self.state.with_file_name("dev");
        std::fs::create_dir(&stage).expect("creating the /dev staging directory");
        let s = stage.display().to_string();
        let mut lines = vec![
            format!("mount -t tmpfs -o mode=0755,nosuid,noexec,strictatime tmpfs {s}"),
            format!("mkdir {s}/pts {s}/shm {s}/char"),
            format!("mount --bind /dev/pts {s}/pts"),
            format!("mount --bind /dev/shm {s}/shm"),
        ];
        for optional in ["mqueue", "hugepages"] {
            if Path::new("/dev").join(optional).is_dir() {
                lines.push(format!("mkdir {s}/{optional}"));
                lines.push(format!("mount --bind /dev/{optional} {s}/{optional}"));
            }
        }
        let ptmx = Path::new("/dev/ptmx");
        let mut nodes: Vec<&str> = PRIVATE_DEV_NODES.to_vec();
        if ptmx.is_symlink() {
            lines.push(format!("ln -s pts/ptmx {s}/ptmx"));
        } else {
            nodes.push("ptmx");
        }
        for node in nodes {
            let meta = std::fs::metadata(Path::new("/dev").join(node))
                .unwrap_or_else(|e| panic!("/dev/{node}: {e}"));
            let (major, minor) = (libc::major(meta.rdev()), libc::minor(meta.rdev()));
            lines.push(format!(
                "mknod -m {:o} {s}/{node} c {major} {minor}",
                meta.mode() & 0o7777
            ));
            lines.push(format!("ln -s ../{node} {s}/char/{major}:{minor}"));
        }
        // systemd's symlinks (dev_setup); /dev/core only where /proc/kcore is.
        lines.push(format!("ln -s /run/systemd/journal/dev-log {s}/log"));
        lines.push(format!("ln -s /proc/self/fd {s}/fd"));
        for (i, name) in ["stdin", "stdout", "stderr"].iter().enumerate() {
            lines.push(format!("ln -s /proc/self/fd/{i} {s}/{name}"));
        }
        if Path::new("/proc/kcore").exists() {
            lines.push(format!("ln -s /proc/kcore {s}/core"));
        }
        lines.push(format!("mount --move {s} /dev"));
        lines.push("mount -o remount,ro,nosuid,noexec,strictatime /dev".into());
        self.script.extend(lines);
        self.launcher_args.push("--deny".into());
        self.launcher_args.push(format!(
            "raw-io={}",
            syscall_set("@raw-io")
                .into_iter()
                .collect::<Vec<_>>()
                .join(",")
        ));
    }

    /// systemd's InaccessiblePaths= for `dir`, where it exists: an empty
    /// read-only directory of mode 000 over it.
    fn make_inaccessible(&mut self, dir: &Path) {
        let Ok(real) = dir.canonicalize() else {
            self.note(format!(
                "not exercised here: {0} made inaccessible (no {0} on this machine)",
                dir.display()
            ));
            return;
        };
        if self.inaccessible.contains(&real) {
            return;
        }
        self.script.push(format!(
            "mount -t tmpfs -o ro,mode=000,nosuid,nodev,noexec tmpfs {}",
            real.display()
        ));
        self.inaccessible.push(real);
    }

    /// The capability bounding set and no-new-privs.
    fn apply_privileges(&mut self) -> Handled {
        let mut handled = Handled::default();
        for (key, removed) in IMPLIED_CAPABILITY_REMOVALS {
            if self.unit.yes(key) {
                for cap in removed {
                    if self.caps.remove(*cap) {
                        self.note(format!(
                            "{key}=yes removes {cap} from the unit's bounding set"
                        ));
                    }
                }
            }
        }
        let caps = self.caps.iter().cloned().collect::<Vec<_>>().join(" ");
        self.note(format!(
            "CapabilityBoundingSet=, AmbientCapabilities=: root with exactly {caps} (setpriv)"
        ));
        handled += "CapabilityBoundingSet";
        handled += "AmbientCapabilities";
        assert!(
            self.unit.yes("NoNewPrivileges"),
            "the unit must set NoNewPrivileges=yes"
        );
        self.note("NoNewPrivileges=yes: setpriv --no-new-privs".into());
        handled += "NoNewPrivileges";
        if let Some(mask) = self.unit.get("UMask") {
            let value = u32::from_str_radix(mask, 8).expect("an octal UMask");
            self.umask = Some(value);
            self.launcher_args
                .extend(["--umask".into(), mask.to_owned()]);
            self.note(format!(
                "UMask={mask}: set before the exec; the profiles' modes checked"
            ));
            handled += "UMask";
        }
        if let Some(nice) = self.unit.get("Nice") {
            let value: i32 = nice.parse().expect("a Nice= number");
            self.nice = Some(value);
            self.launcher_args
                .extend(["--nice".into(), nice.to_owned()]);
            self.note(format!("Nice={nice}: setpriority before the exec"));
            handled += "Nice";
        }
        handled
    }

    /// Every seccomp filter, in systemd's order (the allow list last).
    fn apply_filters(&mut self) -> Handled {
        let mut handled = Handled::default();
        let families = self.unit.list("RestrictAddressFamilies");
        if !families.is_empty() {
            assert!(
                !families[0].starts_with('~') && families[0] != "none",
                "RestrictAddressFamilies={families:?}: this test applies an allow list"
            );
            self.launcher_args
                .extend(["--address-families".into(), families.join(",")]);
            self.note(format!(
                "RestrictAddressFamilies={}: socket(2) of any other family EAFNOSUPPORT",
                families.join(" ")
            ));
            handled += "RestrictAddressFamilies";
        }
        let flags = [
            (
                "MemoryDenyWriteExecute",
                "--memory-deny-write-execute",
                "PR_SET_MDWE and the seccomp rules",
            ),
            (
                "RestrictRealtime",
                "--restrict-realtime",
                "sched_setscheduler(2) to realtime policies refused",
            ),
            (
                "RestrictSUIDSGID",
                "--restrict-suid-sgid",
                "modes with S_ISUID/S_ISGID refused",
            ),
        ];
        for (key, flag, how) in flags {
            if self.unit.yes(key) {
                self.launcher_args.push(flag.into());
                self.note(format!("{key}=yes: {how}"));
                handled += key;
            }
        }
        match self.unit.get("RestrictNamespaces") {
            Some("yes") => {
                self.launcher_args.push("--restrict-namespaces".into());
                self.note(
                    "RestrictNamespaces=yes: clone/unshare with namespace flags and setns \
                     refused, clone3 ENOSYS"
                        .into(),
                );
                handled += "RestrictNamespaces";
            }
            None | Some("no") => {}
            Some(other) => panic!("RestrictNamespaces={other}: this test applies yes"),
        }
        for (key, set) in [
            ("ProtectKernelModules", "@module"),
            ("ProtectClock", "@clock"),
        ] {
            if self.unit.yes(key) {
                let names: Vec<String> = syscall_set(set).into_iter().collect();
                self.launcher_args.push("--deny".into());
                self.launcher_args
                    .push(format!("{}={}", &set[1..], names.join(",")));
            }
        }
        if self.unit.yes("ProtectClock") {
            self.note("ProtectClock=yes: @clock refused, CAP_SYS_TIME and CAP_WAKE_ALARM not in the bounding set".into());
            self.note(
                "not exercised here: DeviceAllow=char-rtc r of ProtectClock= (a cgroup BPF \
                 device program; the private /dev has no rtc)"
                    .into(),
            );
            handled += "ProtectClock";
        }
        match self.unit.get("SystemCallArchitectures") {
            Some("native") => {
                self.launcher_args.push("--native-arch".into());
                self.note(
                    "SystemCallArchitectures=native: foreign-architecture calls kill the process"
                        .into(),
                );
                handled += "SystemCallArchitectures";
            }
            None => {}
            Some(other) => panic!("SystemCallArchitectures={other}: this test applies native"),
        }
        if self.unit.yes("LockPersonality") {
            self.launcher_args.push("--lock-personality".into());
            self.note("LockPersonality=yes: personality(2) only with the current one".into());
            handled += "LockPersonality";
        }
        let filter = self.unit.list("SystemCallFilter");
        if !filter.is_empty() {
            assert!(
                !filter[0].starts_with('~'),
                "SystemCallFilter={filter:?}: this test applies an allow list"
            );
            // systemd adds @default to every allow list.
            let mut allowed = syscall_set("@default");
            for entry in &filter {
                allowed.extend(syscall_set(entry));
            }
            let errno = match self.unit.get("SystemCallErrorNumber") {
                Some(name) => errno_number(name),
                None => {
                    panic!("SystemCallFilter= without SystemCallErrorNumber= kills; not applied")
                }
            };
            self.launcher_args.extend([
                "--allow".into(),
                allowed.iter().cloned().collect::<Vec<_>>().join(","),
                "--errno".into(),
                errno.to_string(),
            ]);
            self.note(format!(
                "SystemCallFilter={} (+@default): {} names from systemd-analyze, anything else {}",
                filter.join(" "),
                allowed.len(),
                self.unit.get("SystemCallErrorNumber").unwrap_or_default()
            ));
            self.note(format!(
                "SystemCallErrorNumber={}: the allow list's default action",
                self.unit.get("SystemCallErrorNumber").unwrap_or_default()
            ));
            self.allowed = allowed;
            handled += "SystemCallFilter";
            handled += "SystemCallErrorNumber";
        }
        self.launcher_args.push("--probe".into());
        handled
    }

    /// The command that runs the daemon with `args` in the sandbox.
    pub fn command(&self, args: &[String]) -> Command {
        let bounding: Vec<String> = self
            .caps
            .iter()
            .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
            .collect();
        let mut cmd = Command::new("unshare");
        cmd.args(&self.unshare)
            .args(["sh", "-c"])
            .arg(format!("{}\nexec \"$@\"", self.script.join("\n")))
            .arg("sh")
            .arg("setpriv")
            .arg(format!("--bounding-set=-all,{}", bounding.join(",")))
            .args(["--inh-caps=-all", "--no-new-privs", "--"])
            .arg(&self.launcher)
            .args(&self.launcher_args)
            .arg("--")
            .arg(&self.bin)
            .args(args);
        cmd
    }

    /// What the running daemon `pid` has in force, read from /proc.
    /// Call after [`Sandbox::check_probes`], which reads the launcher's
    /// count of filters.
    pub fn check_process(&self, pid: u32) {
        let proc = PathBuf::from(format!("/proc/{pid}"));
        let status = std::fs::read_to_string(proc.join("status")).expect("reading the status");
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
                .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
                .to_owned()
        };
        assert_eq!(
            field("Seccomp:"),
            "2",
            "the daemon runs without seccomp filters"
        );
        if let Some(count) = self.filters {
            assert_eq!(
                field("Seccomp_filters:"),
                count.to_string(),
                "the daemon's filters are not the launcher's {count}"
            );
        }
        assert_eq!(field("NoNewPrivs:"), "1");
        if let Some(mask) = self.umask {
            assert_eq!(field("Umask:"), format!("{mask:04o}"));
        }
        if let Some(nice) = self.nice {
            let stat = std::fs::read_to_string(proc.join("stat")).expect("reading the stat");
            // Field 19 (nice), counted after the parenthesized name.
            let after = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or_default();
            let value: i32 = after
                .split_whitespace()
                .nth(16)
                .and_then(|v| v.parse().ok())
                .expect("a nice value in /proc/PID/stat");
            assert_eq!(value, nice, "the daemon's nice value");
        }
        if self.memlock_unlimited {
            let limits = std::fs::read_to_string(proc.join("limits")).expect("reading limits");
            let line = limits
                .lines()
                .find(|l| l.starts_with("Max locked memory"))
                .unwrap_or_default();
            assert!(
                line.contains("unlimited"),
                "the daemon's memlock limit: {line}"
            );
        }
        let ns = |p: &Path, kind: &str| std::fs::read_link(p.join("ns").join(kind)).ok();
        let own = Path::new("/proc/self");
        assert_ne!(
            ns(&proc, "mnt"),
            ns(own, "mnt"),
            "no mount namespace of its own"
        );
        if self.unshare.contains(&"--uts") {
            assert_ne!(
                ns(&proc, "uts"),
                ns(own, "uts"),
                "ProtectHostname: no UTS namespace"
            );
        }
        let cgroups = std::fs::read_to_string(proc.join("cgroup")).expect("reading the cgroups");
        let dirs = self
            .memory
            .iter()
            .map(|(c, _)| c.dir().to_path_buf())
            .chain(self.cpu.iter().map(|(c, _)| c.dir.clone()));
        for dir in dirs {
            let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            assert!(
                cgroups.contains(name),
                "the daemon is not in {}: {cgroups}",
                dir.display()
            );
        }
        self.check_mounts(pid);
    }

    /// The daemon's mounts, from its mountinfo and through its root.
    fn check_mounts(&self, pid: u32) {
        let mounts = mounts_of(pid);
        let top = |path: &str| {
            mounts
                .iter()
                .rev()
                .find(|m| m.point == path)
                .unwrap_or_else(|| panic!("no mount at {path} in the daemon's namespace"))
        };
        let root = PathBuf::from(format!("/proc/{pid}/root"));
        let state = self.state.display().to_string();
        assert!(!top(&state).read_only, "the state directory is read-only");
        if self.unit.get("ProtectSystem") == Some("strict") {
            for (path, _) in &self.host_mounts {
                if !under_any(path, &["/dev", "/proc", "/sys"])
                    && !self.tmp_dirs.iter().any(|t| under_any(path, &[t]))
                    && mounts.iter().any(|m| &m.point == path)
                {
                    assert!(top(path).read_only, "{path} is writable in the sandbox");
                }
            }
        }
        for dir in &self.tmp_dirs {
            let m = top(dir);
            assert!(m.fstype == "tmpfs" && !m.read_only, "{dir}: {m:?}");
        }
        for dir in &self.inaccessible {
            let path = dir.display().to_string();
            assert!(top(&path).read_only, "{path} is writable");
            let inside = root.join(dir.strip_prefix("/").unwrap_or(dir));
            let mode = std::fs::metadata(&inside).map(|m| m.mode() & 0o7777);
            assert_eq!(
                mode.ok(),
                Some(0),
                "{path} is not inaccessible in the sandbox"
            );
        }
        if self.unit.yes("ProtectControlGroups") {
            for m in mounts
                .iter()
                .filter(|m| under_any(&m.point, &["/sys/fs/cgroup"]))
            {
                assert!(m.read_only, "{} is writable", m.point);
            }
        }
        if self.unit.yes("PrivateDevices") {
            let dev = top("/dev");
            assert!(dev.fstype == "tmpfs" && dev.read_only, "/dev: {dev:?}");
            let entries: BTreeSet<String> = std::fs::read_dir(root.join("dev"))
                .expect("listing the daemon's /dev")
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect();
            let expected_nodes: BTreeSet<String> =
                PRIVATE_DEV_NODES.iter().map(|n| n.to_string()).collect();
            assert!(
                expected_nodes.is_subset(&entries),
                "the daemon's /dev lacks API nodes: {entries:?}"
            );
            let allowed: BTreeSet<&str> = PRIVATE_DEV_NODES
                .into_iter()
                .chain([
                    "pts",
                    "ptmx",
                    "shm",
                    "mqueue",
                    "hugepages",
                    "char",
                    "log",
                    "fd",
                    "stdin",
                    "stdout",
                    "stderr",
                    "core",
                ])
                .collect();
            let extra: Vec<&String> = entries
                .iter()
                .filter(|e| !allowed.contains(e.as_str()))
                .collect();
            assert!(extra.is_empty(), "the daemon's /dev has {extra:?}");
        }
        if let Some(value) = self.unit.get("ProtectProc") {
            let proc = top("/proc");
            assert!(
                proc.fstype == "proc" && proc.super_options.contains(&format!("hidepid={value}")),
                "/proc: {proc:?}"
            );
        }
    }

    /// The launcher's probe lines against what the unit's settings refuse.
    pub fn check_probes(&mut self, stderr: &[String]) {
        let got: BTreeMap<String, String> = stderr
            .iter()
            .filter_map(|l| l.strip_prefix("sandbox_exec probe "))
            .filter_map(|l| l.rsplit_once(": "))
            .map(|(name, result)| (name.to_owned(), result.to_owned()))
            .collect();
        let mut want: Vec<(&str, String)> = Vec::new();
        if !self.unit.list("RestrictAddressFamilies").is_empty() {
            let families = self.unit.list("RestrictAddressFamilies");
            for (probe, family) in [
                ("socket(AF_INET)", "AF_INET"),
                ("socket(AF_PACKET)", "AF_PACKET"),
                ("socket(AF_NETLINK)", "AF_NETLINK"),
            ] {
                let ok = families.iter().any(|f| f == family);
                // A raw packet socket needs CAP_NET_RAW, which the daemon lacks.
                let kernel = if family == "AF_PACKET" { "EPERM" } else { "ok" };
                want.push((
                    probe,
                    if ok {
                        kernel.into()
                    } else {
                        "EAFNOSUPPORT".into()
                    },
                ));
            }
        }
        if self.unit.get("RestrictNamespaces") == Some("yes") {
            for probe in [
                "setns(-1, 0)",
                "clone(CLONE_NEWUSER)",
                "unshare(CLONE_NEWNET)",
                "unshare(CLONE_NEWUSER)",
            ] {
                want.push((probe, "EPERM".into()));
            }
            want.push(("clone3", "ENOSYS".into()));
        }
        if self.unit.yes("RestrictRealtime") {
            want.push(("sched_setscheduler(SCHED_FIFO)", "EPERM".into()));
            // Not filtered by systemd either; refused for lack of CAP_SYS_NICE.
            want.push(("sched_setattr(SCHED_FIFO)", "EPERM".into()));
        }
        if self.unit.yes("RestrictSUIDSGID") {
            for probe in [
                "fchmod(S_ISUID)",
                "fchmodat(S_ISGID)",
                "openat(O_CREAT, S_ISUID)",
                "mkdirat(S_ISGID)",
            ] {
                want.push((probe, "EPERM".into()));
            }
        }
        if self.unit.yes("MemoryDenyWriteExecute") {
            for probe in [
                "mmap(PROT_WRITE|PROT_EXEC)",
                "mprotect(+PROT_EXEC)",
                "shmat(SHM_EXEC)",
            ] {
                want.push((probe, "EPERM".into()));
            }
            let mdwe = if kernel_at_least(6, 3) {
                "ok 1"
            } else {
                "EINVAL"
            };
            want.push(("prctl(PR_GET_MDWE)", mdwe.into()));
        }
        if self.unit.yes("LockPersonality") {
            want.push(("personality(current)", "ok".into()));
            want.push(("personality(PER_LINUX32)", "EPERM".into()));
        }
        if self.unit.yes("ProtectClock") {
            want.push(("clock_settime", "EPERM".into()));
        }
        // These two the kernel refuses too without CAP_SYS_MODULE /
        // CAP_SYS_RAWIO / CAP_SYS_ADMIN.
        if self.unit.yes("ProtectKernelModules") {
            want.push(("init_module", "EPERM".into()));
        }
        if self.unit.yes("PrivateDevices") && cfg!(target_arch = "x86_64") {
            want.push(("ioperm", "EPERM".into()));
        }
        if self.unit.yes("ProtectHostname") {
            want.push(("sethostname", "EPERM".into()));
        }
        if !self.allowed.is_empty() {
            let syslog = if self.allowed.contains("syslog") {
                "ok"
            } else {
                "EPERM"
            };
            want.push(("syslog(SIZE_BUFFER)", syslog.into()));
        }
        if self.unit.get("SystemCallArchitectures") == Some("native")
            && cfg!(target_arch = "x86_64")
        {
            // Without the kernel's x32 ABI: ENOSYS; the allow list has no
            // x32 numbers either way.
            want.push(("x32 getpid", "EPERM".into()));
            let i386 = got.get("i386 int 0x80").map(String::as_str);
            if i386 == Some("SIGSEGV") {
                println!(
                    "sandbox: not exercised here: i386 calls (the kernel runs no 32-bit x86 code)"
                );
            } else {
                want.push(("i386 int 0x80", "SIGSYS".into()));
            }
        }
        let wrong: Vec<String> = want
            .iter()
            .filter(|(probe, expected)| got.get(*probe) != Some(expected))
            .map(|(probe, expected)| format!("{probe}: want {expected}, got {:?}", got.get(*probe)))
            .collect();
        assert!(
            wrong.is_empty(),
            "probes the sandbox must refuse:\n{}\nall probe lines:\n{}",
            wrong.join("\n"),
            got.iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        for (probe, result) in &got {
            println!("sandbox: probe {probe}: {result}");
        }
        let launcher = stderr
            .iter()
            .find_map(|l| l.strip_prefix("sandbox_exec: "))
            .and_then(|l| l.split_once(" filters; "))
            .unwrap_or_else(|| panic!("no filter count from the launcher: {stderr:?}"));
        self.filters = Some(launcher.0.parse().expect("a filter count"));
        println!(
            "sandbox: {} probes as the unit says; {} filters; skipped system calls, {}",
            want.len(),
            launcher.0,
            launcher.1
        );
    }

    /// Every file the daemon wrote is within the unit's umask.
    pub fn check_files(&self) {
        let Some(mask) = self.umask else { return };
        for entry in std::fs::read_dir(&self.state).expect("listing the state directory") {
            let entry = entry.expect("a directory entry");
            let mode = entry.metadata().expect("a file's metadata").mode() & 0o7777;
            assert_eq!(
                mode & mask,
                0,
                "{} has mode {mode:o}, beyond UMask={mask:04o}",
                entry.path().display()
            );
        }
    }

    /// What the cgroups recorded: no OOM kill under MemoryMax=, and the
    /// quota's throttling.
    pub fn check_resources(&self) {
        if let Some((cgroup, limit)) = &self.memory {
            let record = cgroup.record();
            println!(
                "sandbox: MemoryMax {} MiB: peak {}, OOM kills {}",
                limit >> 20,
                record.peak.map_or("unknown".into(), |p| format!(
                    "{:.1} MiB",
                    p as f64 / 1048576.0
                )),
                record.oom_kills
            );
            assert_eq!(record.oom_kills, 0, "OOM-killed under MemoryMax=");
        }
        if let Some((cgroup, percent)) = &self.cpu {
            let (periods, throttled, ms) = cgroup.throttling();
            println!(
                "sandbox: CPUQuota {percent}%: throttled in {throttled} of {periods} periods, {ms} ms"
            );
        }
    }

    /// Prints the report: what is applied and how, what is not and why.
    pub fn print_report(&self) {
        for line in &self.report {
            println!("sandbox: {line}");
        }
    }
}

/// Setting names one apply step handled.
#[derive(Default)]
struct Handled(Vec<String>);

impl std::ops::AddAssign<&str> for Handled {
    fn add_assign(&mut self, key: &str) {
        self.0.push(key.to_owned());
    }
}

impl std::ops::Add for Handled {
    type Output = Handled;
    fn add(mut self, other: Handled) -> Handled {
        self.0.extend(other.0);
        self
    }
}

impl Handled {
    fn iter(&self) -> impl Iterator<Item = &String> {
        self.0.iter()
    }
}

/// linux/capability.h.
const CAP_SYS_RESOURCE: u32 = 24;

/// Whether the test itself has capability `cap` in effect.
fn own_capability(cap: u32) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").expect("reading our status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << cap) != 0)
}

fn under_any(path: &str, dirs: &[&str]) -> bool {
    dirs.iter()
        .any(|d| path == *d || path.strip_prefix(d).is_some_and(|r| r.starts_with('/')))
}

/// One line of a mountinfo file.
#[derive(Debug)]
struct Mount {
    point: String,
    read_only: bool,
    fstype: String,
    super_options: String,
}

/// Mount points decode `\ooo` escapes (a space is `\040`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
        match (bytes[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split_whitespace().collect();
            let right: Vec<&str> = right.split_whitespace().collect();
            Some(Mount {
                point: unescape(left.get(4)?),
                read_only: left.get(5)?.split(',').any(|o| o == "ro"),
                fstype: right.first()?.to_string(),
                super_options: right.get(2).unwrap_or(&"").to_string(),
            })
        })
        .collect()
}

fn mounts_of(pid: u32) -> Vec<Mount> {
    let path = format!("/proc/{pid}/mountinfo");
    parse_mountinfo(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}")))
}

/// The host's mount points (the test's namespace), each once.
fn host_mounts() -> Vec<(String, String)> {
    let mut seen = BTreeSet::new();
    mounts_of(std::process::id())
        .into_iter()
        .filter(|m| !m.point.contains(' ') && seen.insert(m.point.clone()))
        .map(|m| (m.point, m.fstype))
        .collect()
}

/// The system calls of a name or `@set` as this machine's systemd expands
/// it (`systemd-analyze syscall-filter`), sets within sets followed.
pub fn syscall_set(entry: &str) -> BTreeSet<String> {
    let groups = syscall_groups();
    let mut out = BTreeSet::new();
    let mut pending = vec![entry.to_owned()];
    let mut seen = BTreeSet::new();
    while let Some(name) = pending.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        if name.starts_with('@') {
            let members = groups
                .get(&name)
                .unwrap_or_else(|| panic!("systemd-analyze knows no set {name}"));
            pending.extend(members.iter().cloned());
        } else {
            out.insert(name);
        }
    }
    out
}

/// Every set `systemd-analyze syscall-filter` lists, with its members.
fn syscall_groups() -> BTreeMap<String, Vec<String>> {
    let mut cmd = Command::new("systemd-analyze");
    cmd.arg("syscall-filter");
    let output = run_with_timeout(cmd, "systemd-analyze", Duration::from_secs(30));
    assert!(
        output.status.success(),
        "systemd-analyze syscall-filter failed (the test needs systemd's tools): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        if line.starts_with('@') {
            current = Some(line.trim().to_owned());
            groups.entry(line.trim().to_owned()).or_default();
        } else if line.trim().is_empty() || line.starts_with('#') {
            // A blank line ends a set; the closing comment lists calls of
            // no set.
            current = None;
        } else if let Some(group) = &current {
            let member = line.trim();
            if !member.starts_with('#') {
                groups
                    .entry(group.clone())
                    .or_default()
                    .push(member.to_owned());
            }
        }
    }
    groups
}

/// The number of an errno name the unit may use.
fn errno_number(name: &str) -> i32 {
    match name {
        "EPERM" => libc::EPERM,
        "EACCES" => libc::EACCES,
        "ENOSYS" => libc::ENOSYS,
        other => other.parse().unwrap_or_else(|_| {
            panic!("SystemCallErrorNumber={other} is not in this test's table")
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_section_only() {
        let unit = Unit::parse(
            "[Unit]\nDescription=x\n[Service]\n# c\nType=notify\nUMask=0027\n[Install]\nWantedBy=y\n",
        );
        assert_eq!(unit.get("Type"), Some("notify"));
        assert_eq!(unit.get("Description"), None);
        assert_eq!(unit.get("WantedBy"), None);
        assert_eq!(unit.keys().len(), 2);
    }

    #[test]
    fn mount_points_unescape() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
        let m = parse_mountinfo("22 1 0:21 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n");
        assert_eq!(m[0].point, "/sys/fs/cgroup");
        assert!(m[0].read_only);
        assert_eq!(m[0].fstype, "tmpfs");
    }

    #[test]
    fn paths_under_directories() {
        assert!(under_any("/sys/fs/cgroup/memory", &["/sys/fs/cgroup"]));
        assert!(under_any("/dev", &["/dev"]));
        assert!(!under_any("/devices", &["/dev"]));
    }
}
