//! Nothing here: this package holds the regression tests of our changes to the vendored
//! `h2` (`tests/changes.rs`, `vendor/README.md`). Inside this workspace they run against
//! `vendor/h2` (the root `Cargo.toml`'s `[patch.crates-io]`); copied out of it, against
//! crates.io's `h2`, where they fail until an h2 release makes the same changes.
