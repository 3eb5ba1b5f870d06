//! Comparators: who the current team is compared with in the iterative trainers (reference
//! §8.2). `api.rs`: candidate responses from an HTTP endpoint (§8.4).
pub mod api;
