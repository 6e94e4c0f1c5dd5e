//! The pure decision core: what to do with each claim, from plain facts, a policy and `now`.
//! No module here performs I/O or reads the clock, so every verdict can be tested, and proven
//! safe, without a cluster. The edge ([`crate::cluster`]) turns API objects into [`facts`].

pub mod annotations;
pub mod facts;
pub mod linking;
pub mod namespace;
pub mod policy;
pub mod provenance;
pub mod quota;
pub mod volumes;
