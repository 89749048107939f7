//! Every provider on core's RDM engine is one endpoint over its own transport: `endpoint` is
//! that endpoint (address mapping, the engine's lock, completions reported unlocked, sleeping
//! through the transport's bell), `seam` the one trait pair a transport implements and calls
//! back through, `bell` the bell of transports that sleep on descriptors.

pub mod bell;
pub mod endpoint;
pub mod seam;
pub mod sources;

pub use bell::{FdBell, Gate};
pub use endpoint::{engine_config, tx_max, RdmEndpoint};
pub use seam::{Bell, Glue, Handler, PeerName, Wire};
