//! What the servers of one host share, in one place: the GPU-memory ledger (`ledger/`: its
//! directory, its lock, each server's entry file, leases and their expiry), this server's
//! reservation in it (`reservation`), lending room to a neighbour that asks (`lending`), the
//! ledger shown to people (`view`: `app ledger`), the footprint a profile measured (`footprint_file`),
//! and the folders workers unpack AOTInductor packages into (`unpack`). Each is opened
//! without following links and refused when it is not what it should be; none can make a
//! supervisor wait.

pub mod footprint_file;
pub mod ledger;
pub mod lending;
pub mod reservation;
pub mod unpack;
pub mod view;
