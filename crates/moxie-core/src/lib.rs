//! The inference engine core.
