//! Every provider on core's RDM engine is one endpoint over its own transport: `endpoint` is
//! that endpoint (address mapping, the engine's lock, completions reported unlocked, sleeping
//! on the transport's descriptors), `seam` the one trait pair a transport implements and calls
//! back through.

pub mod endpoint;
pub mod seam;
pub mod sources;

pub use endpoint::{engine_config, Glue, RdmEndpoint};
pub use seam::{Handler, Wire};
pub use sources::Sources;
