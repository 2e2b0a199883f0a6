//! What keeps a mount whole while it runs, beside the requests: heartbeats, reconnects and the
//! background rebuild ([`rebuild`]), the encoder of cold chunks ([`encode`]), and the admin's changes of its servers, step by step
//! ([`membership`]), with what they have done for the report ([`figures`]). The core (`fs`, `data`, `meta`) never imports upkeep: upkeep drives the
//! core from its own threads.

pub mod encode;
pub mod figures;
pub mod membership;
pub mod rebuild;
