//! Checks of the deployment files in `deploy/`: the systemd unit with
//! `systemd-analyze verify`, the DaemonSet and the kustomization against the
//! Kubernetes schemas with `kubernetes-validate --strict` (from PyPI, kept
//! in a virtualenv under `target/tools/`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// The kubernetes-validate release the checks are written against.
const KUBERNETES_VALIDATE: &str = "kubernetes-validate==1.37.0";
/// Kubernetes versions the manifests must be valid for: the oldest with
/// every field they use (securityContext.appArmorProfile came in 1.30),
/// and the newest that kubernetes-validate knows.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.30.0", "1.37.0"];

fn venv(root: &Path) -> PathBuf {
    root.join("target/tools/kubernetes-validate")
}

fn validator(root: &Path) -> PathBuf {
    venv(root).join("bin/kubernetes-validate")
}

/// Installs kubernetes-validate into its virtualenv unless it is there.
pub fn setup(root: &Path) -> Result<()> {
    let bin = validator(root);
    let installed = Command::new(&bin)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if installed {
        return Ok(());
    }
    let venv = venv(root);
    crate::run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    crate::run(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", KUBERNETES_VALIDATE])
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
    )
}

/// Every check of `deploy/`; `binary` is the built daemon.
pub fn check(root: &Path, binary: &Path) -> Result<()> {
    verify_unit(root, binary)?;
    validate_manifests(root)?;
    same_capabilities(root)
}

/// The DaemonSet adds exactly the capabilities the unit keeps (both were
/// measured together; see the unit's comments).
fn same_capabilities(root: &Path) -> Result<()> {
    let read = |name: &str| {
        let path = root.join("deploy").join(name);
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    };
    let unit = read("profilerd.service")?;
    let mut from_unit: Vec<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .context("deploy/profilerd.service sets no CapabilityBoundingSet")?
        .split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_owned())
        .collect();
    let daemonset = read("daemonset.yaml")?;
    // The one flow list `add: ["BPF", ...]` under securityContext.capabilities.
    let mut from_daemonset: Vec<String> = daemonset
        .lines()
        .find_map(|l| l.trim().strip_prefix("add: ["))
        .and_then(|rest| rest.strip_suffix(']'))
        .context("deploy/daemonset.yaml: no 'add: [...]' capability list on one line")?
        .split(',')
        .map(|c| c.trim().trim_matches('"').to_owned())
        .collect();
    from_unit.sort();
    from_daemonset.sort();
    if from_unit != from_daemonset {
        bail!(
            "deploy/daemonset.yaml adds {from_daemonset:?}, deploy/profilerd.service keeps {from_unit:?}"
        );
    }
    Ok(())
}

/// `systemd-analyze verify` on a copy of the unit whose ExecStart runs the
/// built daemon (verify rejects a unit whose binary is missing). verify
/// exits 0 on unknown keys and bad values, which it only prints: any output
/// fails the check.
fn verify_unit(root: &Path, binary: &Path) -> Result<()> {
    const INSTALLED: &str = "ExecStart=/usr/local/bin/profilerd ";
    let unit = root.join("deploy/profilerd.service");
    let text =
        std::fs::read_to_string(&unit).with_context(|| format!("reading {}", unit.display()))?;
    if text.lines().filter(|l| l.starts_with(INSTALLED)).count() != 1 {
        bail!(
            "{}: expected one line starting with '{INSTALLED}'",
            unit.display()
        );
    }
    let copy_dir = root.join("target/tools/unit-verify");
    std::fs::create_dir_all(&copy_dir)
        .with_context(|| format!("creating {}", copy_dir.display()))?;
    let copy = copy_dir.join("profilerd.service");
    let text = text.replace(INSTALLED, &format!("ExecStart={} ", binary.display()));
    std::fs::write(&copy, text).with_context(|| format!("writing {}", copy.display()))?;
    eprintln!("+ systemd-analyze verify {}", copy.display());
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .context("running systemd-analyze (package systemd)")?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() || !said.trim().is_empty() {
        bail!(
            "systemd-analyze verify {} ({}): {}",
            unit.display(),
            out.status,
            said.trim()
        );
    }
    Ok(())
}

/// deploy/daemonset.yaml alone, and the kustomization as `kubectl
/// kustomize` renders it, against each Kubernetes version, strictly
/// (unknown fields are errors).
fn validate_manifests(root: &Path) -> Result<()> {
    let daemonset = root.join("deploy/daemonset.yaml");
    let rendered = if crate::have("kubectl") {
        let out = Command::new("kubectl")
            .arg("kustomize")
            .arg(root.join("deploy"))
            .output()
            .context("running kubectl kustomize")?;
        if !out.status.success() {
            bail!(
                "kubectl kustomize deploy/ failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Some(out.stdout)
    } else {
        eprintln!("warning: kubectl not found: deploy/kustomization.yaml is not checked");
        None
    };
    for version in KUBERNETES_VERSIONS {
        validate(root, version, Some(&daemonset), None)?;
        if let Some(yaml) = &rendered {
            validate(root, version, None, Some(yaml))?;
        }
    }
    Ok(())
}

/// kubernetes-validate --strict on a file or on YAML given on stdin.
fn validate(root: &Path, version: &str, file: Option<&Path>, stdin: Option<&[u8]>) -> Result<()> {
    let what = file.map_or("kubectl kustomize deploy/".into(), |f| {
        f.display().to_string()
    });
    eprintln!("+ kubernetes-validate --strict -k {version} {what}");
    let mut cmd = Command::new(validator(root));
    cmd.args(["--strict", "--quiet", "-k", version])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match file {
        Some(f) => cmd.arg(f).stdin(Stdio::null()),
        None => cmd.arg("-").stdin(Stdio::piped()),
    };
    let mut child = cmd
        .spawn()
        .context("running kubernetes-validate (cargo xtask setup installs it)")?;
    if let (Some(yaml), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(yaml)
            .context("writing to kubernetes-validate")?;
    }
    let out = child
        .wait_with_output()
        .context("waiting for kubernetes-validate")?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // --quiet prints only warnings and failures: any output fails too.
    if !out.status.success() || !said.trim().is_empty() {
        bail!(
            "{what} does not validate against Kubernetes {version} ({}): {}",
            out.status,
            said.trim()
        );
    }
    Ok(())
}
