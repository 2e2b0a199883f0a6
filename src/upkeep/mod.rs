//! What keeps a mount whole while it runs, beside the requests: heartbeats, reconnects and the
//! background rebuild ([`rebuild`]), and the admin's changes of its servers, step by step
//! ([`membership`]). The core (`fs`, `data`, `meta`) never imports upkeep: upkeep drives the
//! core from its own threads.

pub mod membership;
pub mod rebuild;
