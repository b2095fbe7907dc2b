//! `switchyard executors`: what is registered and loaded, and what this
//! machine can run.

use std::path::PathBuf;

use anyhow::Result;
use switchyard_core::Device;
use switchyard_core::config::executor_statuses;
use switchyard_core::executor::Availability;

use crate::planning::{load_config, plugins_not_loaded};

/// `switchyard executors`: every executor, registered or from a plugin,
/// with what it is and whether it is available here; then the plugins that
/// could not be loaded, and why; then CUDA's state. A plugin asked for and
/// not loaded (not marked optional) makes it fail, after the listing.
pub(crate) fn list(config: Option<PathBuf>, plugins: Vec<PathBuf>, isolated: bool) -> Result<()> {
    let config = load_config(config.as_deref(), false)?;
    let (loaded, failed) = switchyard_plugin_host::load_configured_with(&config, &plugins, isolated);
    println!(
        "{:<14} {:<9} {:<9} {:<10} {:<4} availability",
        "name", "version", "kind", "devices", "abi"
    );
    let rows = executor_statuses()
        .into_iter()
        .map(|(info, a)| (info, a, None))
        .chain(
            loaded
                .iter()
                .map(|p| (p.executor.info(), p.executor.availability(), Some(p))),
        );
    for (info, availability, plugin) in rows {
        // An executor with a CUDA backend may lack just that one here.
        let cuda_missing = info.devices.iter().any(|d| d == "cuda")
            && switchyard_core::executor::create(&info.name)
                .is_ok_and(|e| e.availability_on(Device::Cuda(0)) != Availability::Available);
        let avail = match availability {
            Availability::Available if cuda_missing && info.devices.len() > 1 => {
                "available (not on cuda here: see below)".to_string()
            }
            Availability::Available => "available".to_string(),
            Availability::Unavailable(why) => format!("unavailable: {why}"),
        };
        let kind = format!("{:?}", info.kind).to_lowercase();
        let (abi, from) = match plugin {
            Some(p) if p.defaulted.is_empty() => (
                p.abi_version.to_string(),
                format!(" (plugin {})", p.path.display()),
            ),
            Some(p) => (
                p.abi_version.to_string(),
                format!(
                    " (plugin {}; without {}: defaults)",
                    p.path.display(),
                    p.defaulted.join(", ")
                ),
            ),
            None => ("-".to_string(), String::new()),
        };
        println!(
            "{:<14} {:<9} {:<9} {:<10} {:<4} {avail}{from}",
            info.name,
            info.version,
            kind,
            info.devices.join(","),
            abi
        );
    }
    if !failed.is_empty() {
        println!("\nPlugins not loaded:");
        for f in &failed {
            let what = if f.optional {
                "optional, skipped"
            } else {
                "required"
            };
            println!("  {} ({what})", f.error);
        }
    }
    println!("\nCUDA on this machine:");
    for line in switchyard_cuda::probe().summary() {
        println!("  {line}");
    }
    let required: Vec<_> = failed.into_iter().filter(|f| !f.optional).collect();
    if !required.is_empty() {
        return Err(plugins_not_loaded(&required));
    }
    Ok(())
}
