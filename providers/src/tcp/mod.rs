//! tcp: the RDM engine's frames over TCP sockets, one connection per peer pair.

pub mod net;
