//! The records workspace-gc keeps on its Lease besides the election's own `spec` fields, read
//! and written here only: each is an annotation whose text the concern that owns it encodes.
//!
//! | Version | Annotations written |
//! |---|---|
//! | 1 (7c806ec) | `deletions`, the cap's ledger (`daemon/cap_ledger.rs`); `quota-rounds`, quota pressure's rounds (`decide/quota/lease.rs`), only with a ledger |
//! | 2 (this one) | the same, and `deletes-in-flight`, the DELETEs that may still land (`cluster/in_flight.rs`), with every write where it changed and removed when none are |
//!
//! Each version reads what an earlier one wrote: a key it lacks reads as none. An earlier one
//! reads a later one's Lease as its own: it reads only the keys it knows, and its merge
//! patches leave the others. So no key an earlier version reads changes its meaning or form.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use serde_json::{Map, Value, json};

use crate::cluster::in_flight::{self, InFlight};
use crate::contract::annotations::{DELETES_IN_FLIGHT, DELETIONS, QUOTA_ROUNDS};

/// The records as a Lease holds them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Records {
    /// The cap's ledger.
    pub ledger: Option<String>,
    /// Quota pressure's rounds.
    pub rounds: Option<String>,
    /// The DELETEs in flight, as text ([`Records::in_flight`] reads it).
    in_flight: Option<String>,
}

impl Records {
    pub fn read(lease: &Lease) -> Self {
        let annotation = |key: &str| {
            (lease.metadata.annotations.as_ref())
                .and_then(|annotations| annotations.get(key).cloned())
        };
        Self {
            ledger: annotation(DELETIONS),
            rounds: annotation(QUOTA_ROUNDS),
            in_flight: annotation(DELETES_IN_FLIGHT),
        }
    }

    /// The DELETEs in flight the Lease names, by claim UID (none without the key); `Err` when
    /// its text is not a list of them.
    pub fn in_flight(&self) -> Result<BTreeMap<String, InFlight>, serde_json::Error> {
        self.in_flight
            .as_deref()
            .map_or_else(|| Ok(BTreeMap::new()), in_flight::parse)
    }
}

/// The cap's ledger as a write carries it, and quota pressure's rounds staged to go with it.
#[derive(Debug, Clone, Copy)]
pub struct Counted<'a> {
    pub ledger: &'a str,
    pub rounds: Option<&'a str>,
}

/// The annotations of a merge patch over a Lease that held `read`: `counted` when given, and
/// `in_flight` where it differs from what `read` names (a null removes the key: nothing is in
/// flight any more). `None` when it changes none.
pub fn patch(
    read: &Records,
    counted: Option<Counted<'_>>,
    in_flight: &BTreeMap<String, InFlight>,
) -> Option<Map<String, Value>> {
    let mut annotations = Map::new();
    if let Some(counted) = counted {
        annotations.insert(DELETIONS.to_owned(), json!(counted.ledger));
        if let Some(rounds) = counted.rounds {
            annotations.insert(QUOTA_ROUNDS.to_owned(), json!(rounds));
        }
    }
    let named = in_flight::to_text(in_flight);
    if named != read.in_flight {
        annotations.insert(DELETES_IN_FLIGHT.to_owned(), json!(named));
    }
    (!annotations.is_empty()).then_some(annotations)
}

/// The annotations of a Lease created again with `counted` (the ledger this replica knows, and
/// the rounds staged) and `in_flight` (the DELETEs that may still land, as this replica knows
/// them): what a write over a Lease without records would carry ([`patch`]), so the names
/// survive a Lease created again as the ledger does. `None` when there are none.
pub fn created(
    counted: Option<Counted<'_>>,
    in_flight: &BTreeMap<String, InFlight>,
) -> Option<BTreeMap<String, String>> {
    let annotations = patch(&Records::default(), counted, in_flight)?;
    let text = |(key, value): (String, Value)| match value {
        Value::String(text) => Some((key, text)),
        _ => None,
    };
    Some(annotations.into_iter().filter_map(text).collect())
}

/// The records as this replica keeps them between Lease writes.
#[derive(Debug, Default)]
pub struct Kept {
    /// The ledger as this replica knows it: while leading, the last it wrote (or found on
    /// winning); while standing by, the last it read on the Lease.
    pub ledger: Option<String>,
    /// Quota pressure's rounds, to be written with the next ledger.
    pub staged_rounds: Option<String>,
    /// The rounds found on the Lease when it was last won.
    pub found_rounds: Option<String>,
    /// While standing by, the DELETEs in flight the Lease named when last read: a Lease this
    /// replica creates again names them (while leading, the registry says what may land).
    pub in_flight: BTreeMap<String, InFlight>,
}

impl Kept {
    /// The ledger known and the rounds staged, as a Lease created again carries them.
    pub fn known(&self) -> Option<Counted<'_>> {
        (self.ledger.as_deref()).map(|ledger| self.counted(ledger))
    }

    /// What a write that carries `ledger` writes of the records kept.
    pub fn counted<'a>(&'a self, ledger: &'a str) -> Counted<'a> {
        Counted {
            ledger,
            rounds: self.staged_rounds.as_deref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn lease(annotations: &[(&str, &str)]) -> Lease {
        Lease {
            metadata: ObjectMeta {
                annotations: Some(
                    (annotations.iter())
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: None,
        }
    }

    const LEDGER: &str = r#"{"bucketMillis":6000,"deletions":[[1764500000000,3]]}"#;
    const ROUNDS: &str = r#"{"rounds":{}}"#;
    const NAMED: &str =
        r#"[{"namespace":"ml","name":"nb-build-workspace","uid":"u1","resourceVersion":"42"}]"#;

    fn named() -> BTreeMap<String, InFlight> {
        in_flight::parse(NAMED).expect("parses")
    }

    /// A Lease as version 1 (7c806ec) leaves it: its ledger and rounds, nothing in flight.
    #[test]
    fn a_lease_of_version_1_reads_as_its_ledger_and_rounds_with_nothing_in_flight() {
        let records = Records::read(&lease(&[(DELETIONS, LEDGER), (QUOTA_ROUNDS, ROUNDS)]));
        assert_eq!(records.ledger.as_deref(), Some(LEDGER));
        assert_eq!(records.rounds.as_deref(), Some(ROUNDS));
        assert!(records.in_flight().expect("none").is_empty());
        let none = Records::read(&Lease::default());
        assert_eq!(none, Records::default());
    }

    /// What this version writes: version 1's keys as version 1 wrote them (it reads them), and
    /// the DELETEs in flight only where they changed.
    #[test]
    fn a_write_carries_version_1_keys_unchanged_and_what_is_in_flight_where_it_changed() {
        let counted = Counted {
            ledger: LEDGER,
            rounds: Some(ROUNDS),
        };
        let empty = Records::default();
        assert_eq!(
            patch(&empty, Some(counted), &named()).map(Value::Object),
            Some(json!({ DELETIONS: LEDGER, QUOTA_ROUNDS: ROUNDS, DELETES_IN_FLIGHT: NAMED })),
        );
        let without_rounds = Counted {
            rounds: None,
            ..counted
        };
        assert_eq!(
            patch(&empty, Some(without_rounds), &BTreeMap::new()).map(Value::Object),
            Some(json!({ DELETIONS: LEDGER })),
            "no rounds staged: the Lease's stay",
        );
        let naming = Records::read(&lease(&[(DELETES_IN_FLIGHT, NAMED)]));
        assert_eq!(naming.in_flight().expect("reads"), named());
        assert_eq!(
            patch(&naming, None, &named()),
            None,
            "unchanged: not written"
        );
        assert_eq!(
            patch(&naming, None, &BTreeMap::new()).map(Value::Object),
            Some(json!({ DELETES_IN_FLIGHT: null })),
            "none left: the key goes",
        );
        let unreadable = Records::read(&lease(&[(DELETES_IN_FLIGHT, "not json")]));
        assert!(unreadable.in_flight().is_err());
    }

    #[test]
    fn a_lease_created_again_carries_the_ledger_known_the_rounds_staged_and_the_names() {
        let counted = Counted {
            ledger: LEDGER,
            rounds: Some(ROUNDS),
        };
        let annotations = created(Some(counted), &named()).expect("a ledger");
        let read = Records::read(&lease(&[]));
        assert_eq!(read.ledger, None);
        let again = Lease {
            metadata: ObjectMeta {
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: None,
        };
        let read = Records::read(&again);
        assert_eq!(
            (read.ledger.as_deref(), read.rounds.as_deref()),
            (Some(LEDGER), Some(ROUNDS))
        );
        assert_eq!(read.in_flight().expect("reads"), named(), "the names too");
        let unknown = created(None, &named()).expect("names");
        assert_eq!(unknown.keys().collect::<Vec<_>>(), [DELETES_IN_FLIGHT]);
        assert_eq!(created(None, &BTreeMap::new()), None, "nothing known: none");
    }
}
