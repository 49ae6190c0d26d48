//! The kernels of the matrix: which Debian packages they come from (pinned
//! here and nowhere else), fetching them with `apt-get download` and keeping
//! the extracted `vmlinuz` and `config` under `target/vm/kernels/`.
//!
//! Debian's cloud kernels boot under QEMU from an initramfs alone: the
//! serial console, devtmpfs, BTF, BPF, uprobes, perf events and tracefs are
//! built in, so no modules are needed (6.1 builds virtio as modules and
//! neither has 9p, which is why the files go in the initramfs).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// One kernel of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kernel {
    /// What `--kernel` names it: the LTS series.
    pub name: &'static str,
    /// The Debian binary package holding the kernel image.
    pub package: &'static str,
    /// The package's exact version, so that every machine boots the same
    /// kernel.
    pub version: &'static str,
    /// Where Debian 12 publishes it (for the docs and error messages).
    pub suite: &'static str,
}

/// The pinned kernels, oldest first. Debian 12's own 6.1, and the 6.12 that
/// Debian 12 ships through its security archive (the kernel of Debian 13
/// and of Amazon Linux 2023's newer images). These are the builds issue 18
/// measured first; a newer ABI of either is a new row here.
pub const KERNELS: &[Kernel] = &[
    Kernel {
        name: "6.1",
        package: "linux-image-6.1.0-50-cloud-amd64",
        version: "6.1.176-1",
        suite: "bookworm, bookworm-security",
    },
    Kernel {
        name: "6.12",
        package: "linux-image-6.12.100+deb12-cloud-amd64",
        version: "6.12.100-1~deb12u1",
        suite: "bookworm-security",
    },
];

/// The kernel `--kernel NAME` selects.
pub fn by_name(name: &str) -> Result<Kernel> {
    KERNELS
        .iter()
        .find(|k| k.name == name)
        .copied()
        .with_context(|| {
            let names: Vec<&str> = KERNELS.iter().map(|k| k.name).collect();
            format!(
                "no kernel {name:?} in the matrix; choose one of {}",
                names.join(", ")
            )
        })
}

/// A kernel fetched and extracted: its image and its build configuration.
pub struct Fetched {
    pub vmlinuz: PathBuf,
    pub config: PathBuf,
}

impl Kernel {
    /// `apt-get download`'s argument: the package at its pinned version.
    pub fn apt_spec(&self) -> String {
        format!("{}={}", self.package, self.version)
    }

    /// The cache directory for this exact build, under `target/vm/kernels/`.
    fn cache_dir(&self, root: &Path) -> PathBuf {
        // `~` and `+` are fine in file names; the version keeps two
        // builds of one package apart.
        root.join("target/vm/kernels")
            .join(format!("{}_{}", self.package, self.version))
    }

    /// The kernel's image and config, downloaded and extracted on first use
    /// and taken from the cache afterwards (a second call downloads
    /// nothing).
    pub fn fetch(&self, root: &Path) -> Result<Fetched> {
        let dir = self.cache_dir(root);
        let fetched = Fetched {
            vmlinuz: dir.join("vmlinuz"),
            config: dir.join("config"),
        };
        if fetched.vmlinuz.is_file() && fetched.config.is_file() {
            return Ok(fetched);
        }
        let parent = dir.parent().context("the kernel cache has a parent")?;
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        // Downloaded and extracted beside the cache and renamed into place
        // at the end, so that an interrupted fetch leaves no half entry.
        let work = tempfile::Builder::new()
            .prefix(".fetch-")
            .tempdir_in(parent)
            .context("creating a download directory")?;
        let deb = self.download(work.path())?;
        extract_boot(&deb, work.path())?;
        let boot = work.path().join("boot");
        let staged = work.path().join("kernel");
        fs::create_dir(&staged)?;
        for (prefix, name) in [("vmlinuz-", "vmlinuz"), ("config-", "config")] {
            let found = find_prefixed(&boot, prefix)?;
            fs::rename(&found, staged.join(name))
                .with_context(|| format!("moving {}", found.display()))?;
        }
        if dir.exists() {
            fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        fs::rename(&staged, &dir).with_context(|| format!("creating {}", dir.display()))?;
        eprintln!("kernel {} cached in {}", self.name, dir.display());
        Ok(fetched)
    }

    /// Downloads the package's .deb into `dir` and returns its path. A
    /// fresh machine may not know the package yet: then the package lists
    /// are refreshed once and the download retried.
    fn download(&self, dir: &Path) -> Result<PathBuf> {
        let download = || {
            let mut cmd = Command::new("apt-get");
            // The download directory is root's; apt's unprivileged
            // sandbox user could not write it.
            cmd.args(["-q", "-o", "APT::Sandbox::User=root", "download"])
                .arg(self.apt_spec())
                .current_dir(dir);
            crate::run(&mut cmd)
        };
        if download().is_err() {
            crate::run(Command::new("apt-get").args(["update", "-qq"]))?;
            download().with_context(|| {
                format!(
                    "downloading {} (Debian 12's {}); is the suite in apt's sources?",
                    self.apt_spec(),
                    self.suite
                )
            })?;
        }
        let deb = fs::read_dir(dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .with_context(|| format!("apt-get download left no .deb in {}", dir.display()))?;
        Ok(deb)
    }
}

/// Extracts the package's `./boot/` (image, config, System.map) into
/// `dir/boot`, without the modules, which the initramfs does not need.
fn extract_boot(deb: &Path, dir: &Path) -> Result<()> {
    let mut dpkg = Command::new("dpkg-deb")
        .arg("--fsys-tarfile")
        .arg(deb)
        .stdout(Stdio::piped())
        .spawn()
        .context("starting dpkg-deb")?;
    let tar_input = dpkg.stdout.take().context("dpkg-deb's stdout is piped")?;
    let tar = Command::new("tar")
        .args(["-x", "-f", "-", "-C"])
        .arg(dir)
        .arg("./boot")
        .stdin(tar_input)
        .status()
        .context("starting tar")?;
    let dpkg = dpkg.wait().context("waiting for dpkg-deb")?;
    if !dpkg.success() || !tar.success() {
        bail!(
            "extracting ./boot from {} failed (dpkg-deb: {dpkg}, tar: {tar})",
            deb.display()
        );
    }
    Ok(())
}

/// The one file in `dir` whose name starts with `prefix`.
fn find_prefixed(dir: &Path, prefix: &str) -> Result<PathBuf> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(prefix))
        {
            found.push(path);
        }
    }
    match found.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!(
            "expected one {prefix}* in {}, found {}",
            dir.display(),
            found.len()
        ),
    }
}

/// The build options profilerd's probes and the VM rely on.
pub const PROFILER_OPTIONS: &[&str] = &[
    "CONFIG_DEBUG_INFO_BTF",
    "CONFIG_BPF_SYSCALL",
    "CONFIG_BPF_EVENTS",
    "CONFIG_UPROBES",
    "CONFIG_PERF_EVENTS",
    "CONFIG_FTRACE_SYSCALLS",
    "CONFIG_FPROBE",
    "CONFIG_VIRTIO_PCI",
    "CONFIG_NET_9P",
    "CONFIG_VIRTIO_FS",
];

/// The options of a kernel config (`CONFIG_X=y` lines, and `# CONFIG_X is
/// not set` as `n`) among `wanted`, in the order asked.
pub fn config_options(config: &str, wanted: &[&str]) -> Vec<(String, String)> {
    wanted
        .iter()
        .map(|name| {
            let value = config
                .lines()
                .find_map(|line| {
                    if let Some(rest) = line.strip_prefix(name) {
                        return rest.strip_prefix('=').map(str::to_string);
                    }
                    let unset = line.strip_prefix("# ")?.strip_prefix(name)?;
                    (unset == " is not set").then(|| "n".to_string())
                })
                .unwrap_or_else(|| "n".to_string());
            (name.to_string(), value)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_choose_the_pinned_packages() {
        let old = by_name("6.1").unwrap();
        assert_eq!(old.package, "linux-image-6.1.0-50-cloud-amd64");
        assert_eq!(old.apt_spec(), "linux-image-6.1.0-50-cloud-amd64=6.1.176-1");
        let new = by_name("6.12").unwrap();
        assert!(new.package.starts_with("linux-image-6.12."));
        assert!(new.package.ends_with("+deb12-cloud-amd64"));
    }

    #[test]
    fn unknown_names_list_the_choices() {
        let err = by_name("6.6").unwrap_err().to_string();
        assert!(err.contains("6.1, 6.12"), "{err}");
        // A prefix is not a match: "6.1" must not pick 6.12 or the reverse.
        assert!(by_name("6").is_err());
    }

    #[test]
    fn every_name_is_unique() {
        for (i, k) in KERNELS.iter().enumerate() {
            assert!(KERNELS[i + 1..].iter().all(|o| o.name != k.name));
        }
    }

    #[test]
    fn config_options_read_set_and_unset() {
        let config =
            "CONFIG_BPF=y\n# CONFIG_NET_9P is not set\nCONFIG_VIRTIO=m\nCONFIG_BPF_SYSCALL=y\n";
        let got = config_options(
            config,
            &["CONFIG_BPF", "CONFIG_NET_9P", "CONFIG_VIRTIO", "CONFIG_X"],
        );
        let values: Vec<&str> = got.iter().map(|(_, v)| v.as_str()).collect();
        assert_eq!(values, ["y", "n", "m", "n"]);
    }
}
