//! The processes the daemon profiles: their table (mapped objects, images,
//! lifetimes, fed by process events) and the labels their environment
//! gives them (container, pod, systemd unit).

pub mod environment;
mod lineage;
pub(crate) mod objects;
pub(crate) mod process;
