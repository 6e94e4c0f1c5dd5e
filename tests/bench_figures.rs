//! Unit tests of the benchmark's figures (bench/): its statistics and its targets table, on
//! figures made up here. The modules are included by path, as the benchmark includes the test
//! kit; the benchmark itself needs a control plane and an hour.

// The whole record of a run is the benchmark's; these tests read its figures and its JSON.
#[allow(dead_code)]
#[path = "../bench/results.rs"]
mod results;
#[path = "../bench/statistics.rs"]
mod statistics;
#[path = "support/stats.rs"]
mod stats;
#[path = "../bench/targets.rs"]
mod targets;

use results::Counts;

/// Counts of (verb, resource, requests), as the audit log would give them.
fn counts(entries: &[(&str, &str, u64)]) -> Counts {
    let mut counts = Counts::default();
    for (verb, resource, n) in entries {
        *counts.by_verb.entry((*verb).to_owned()).or_default() += n;
        *counts
            .by_verb_resource
            .entry(format!("{verb} {resource}"))
            .or_default() += n;
        counts.total += n;
    }
    counts
}

mod statistics_tests {
    use super::counts;
    use crate::results::{Contender, EventKind, ProcSample, SizeResult};
    use crate::statistics::*;

    const OWNER: EventKind = EventKind::OwnerDeleted;
    const TTL: EventKind = EventKind::TtlPassed;

    #[test]
    fn lags_of_one_kind_leave_the_other_out_and_count_what_was_not_reclaimed() {
        let lags = [
            (OWNER, Some(0.3)),
            (TTL, Some(9.0)),
            (OWNER, Some(0.1)),
            (OWNER, None),
        ];
        let owner = lag_stats(&lags, Some(OWNER));
        assert_eq!(owner.events, 3);
        assert_eq!(owner.reclaimed, 2);
        assert!(!owner.complete());
        assert_eq!(owner.p50, Some(0.1));
        assert_eq!(owner.max, Some(0.3));
        let all = lag_stats(&lags, None);
        assert_eq!((all.events, all.reclaimed), (4, 3));
        assert_eq!(all.max, Some(9.0));
    }

    #[test]
    fn p99_of_a_hundred_lags_is_the_99th_smallest() {
        let lags: Vec<_> = (1..=100).rev().map(|i| (TTL, Some(f64::from(i)))).collect();
        let stats = lag_stats(&lags, None);
        assert_eq!(stats.p99, Some(99.0));
        assert_eq!(stats.p50, Some(50.0));
        assert!(stats.complete());
    }

    #[test]
    fn counts_are_written_in_groups_of_three_digits() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(47_280), "47,280");
        assert_eq!(group(1_234_567), "1,234,567");
    }

    #[test]
    fn no_lags_have_no_percentiles() {
        let stats = lag_stats(&[(OWNER, None)], None);
        assert_eq!((stats.p50, stats.p99, stats.max), (None, None, None));
        assert_eq!((stats.events, stats.reclaimed), (1, 0));
    }

    #[test]
    fn reads_per_claim_count_gets_and_lists_but_not_the_lease() {
        let counts = counts(&[
            ("get", "notebookvalidationjobs", 10),
            ("get", "leases", 7),
            ("list", "pods", 30),
            ("delete", "persistentvolumeclaims", 10),
            ("patch", "leases", 12),
        ]);
        assert_eq!(reads_per_claim(&counts, 10), Some(4.0));
        assert_eq!(reads_per_claim(&counts, 0), None);
        assert_eq!(per_claim(5.0, 2), Some(2.5));
    }

    fn size(n: usize, tracked: u64, after_sync_kib: u64, peak_kib: u64) -> SizeResult {
        SizeResult {
            n,
            contenders: vec![Contender {
                tracked: Some(tracked),
                at_ready: Some(ProcSample {
                    rss_kib: after_sync_kib,
                    ..ProcSample::default()
                }),
                at_end: Some(ProcSample {
                    hwm_kib: peak_kib,
                    ..ProcSample::default()
                }),
                ..Contender::default()
            }],
            ..SizeResult::default()
        }
    }

    #[test]
    fn memory_is_a_line_through_the_smallest_and_largest_cache() {
        // 10 MiB + 1 KiB per object after sync; peaks 2 and 5 MiB above it.
        let sizes = [
            size(1_000, 5_000, 10 * 1024 + 5_000, 12 * 1024 + 5_000),
            size(10_000, 50_000, 10 * 1024 + 50_000, 15 * 1024 + 50_000),
        ];
        let model = memory_model(&sizes).expect("two sizes give a line");
        assert!((model.bytes_per_object - 1024.0).abs() < 1e-6);
        assert!((model.base_bytes - 10.0 * 1048576.0).abs() < 1e-3);
        assert!((model.in_flight_bytes - 5.0 * 1048576.0).abs() < 1e-3);
        assert_eq!(model.points, [(5_000.0, 1_000), (50_000.0, 10_000)]);
        let expected = (10.0 + 5.0) * 1048576.0 + 1024.0 * 100.0;
        assert!((model.bytes_for(100.0) - expected).abs() < 1e-3);
    }

    #[test]
    fn one_size_or_a_churn_only_build_gives_no_line() {
        assert_eq!(memory_model(&[size(1_000, 5_000, 9_000, 9_500)]), None);
        let mut churn_only = size(10_000, 50_000, 60_000, 61_000);
        churn_only.contenders[0].churn_only = true;
        assert_eq!(
            memory_model(&[size(1_000, 5_000, 9_000, 9_500), churn_only]),
            None
        );
    }
}

mod targets_tests {
    use super::counts;
    use crate::results::{Contender, Counts, EventKind, ProcSample, Role, SizeResult, Steady};
    use crate::targets::*;

    fn lags(values: &[Option<f64>]) -> Vec<(EventKind, Option<f64>)> {
        values
            .iter()
            .map(|lag| (EventKind::TtlPassed, *lag))
            .collect()
    }

    fn churn(reclaimed: usize, requests: Counts, list_bytes: f64, cpu: f64) -> Steady {
        Steady {
            lags: lags(&vec![Some(0.1); reclaimed]),
            requests,
            list_bytes,
            apiserver_cpu_s: cpu,
            window_s: 600.0,
            ..Steady::default()
        }
    }

    /// A 10,000-build run that meets every target.
    fn good_run() -> Vec<SizeResult> {
        let daemon = Contender {
            name: "workspace-gc".into(),
            role: Role::Daemon,
            ready_s: Some(2.0),
            lags: lags(&[Some(0.1), Some(0.2)]),
            steady: counts(&[
                ("get", "notebookvalidationjobs", 2),
                ("delete", "persistentvolumeclaims", 2),
            ]),
            at_end: Some(ProcSample {
                hwm_kib: 60 * 1024,
                ..ProcSample::default()
            }),
            churn: Some(churn(
                10,
                counts(&[("get", "leases", 40), ("list", "pods", 5)]),
                10.0 * 1024.0,
                0.5,
            )),
            idle: Some(Steady {
                requests: counts(&[("get", "leases", 30), ("watch", "pods", 2)]),
                window_s: 600.0,
                ..Steady::default()
            }),
            ..Contender::default()
        };
        let gc = Contender {
            role: Role::Gc,
            churn: Some(churn(10, Counts::default(), 0.0, 0.6)),
            ..Contender::default()
        };
        vec![SizeResult {
            n: REFERENCE_N,
            full: true,
            contenders: vec![daemon, gc],
            ..SizeResult::default()
        }]
    }

    fn verdicts(sizes: &[SizeResult]) -> Vec<Verdict> {
        judge(sizes).into_iter().map(|j| j.verdict).collect()
    }

    #[test]
    fn a_run_within_every_bound_meets_every_target() {
        let judged = judge(&good_run());
        assert_eq!(judged.len(), TARGETS.len());
        for row in &judged {
            assert_eq!(row.verdict, Verdict::Met, "{}: {}", row.promise, row.shown);
        }
    }

    #[test]
    fn each_figure_past_its_bound_misses_its_own_target_only() {
        type Spoil = Box<dyn Fn(&mut Contender)>;
        let cases: Vec<(&str, Spoil)> = vec![
            (
                "memory",
                Box::new(|d| d.at_end.as_mut().unwrap().hwm_kib = 64 * 1024),
            ),
            ("scale", Box::new(|d| d.ready_s = Some(10.0))),
            (
                "burst: lag",
                Box::new(|d| d.lags.push((EventKind::OwnerDeleted, None))),
            ),
            (
                "burst: at most 1 DELETE",
                Box::new(|d| d.steady = counts(&[("delete", "persistentvolumeclaims", 3)])),
            ),
            (
                "burst: at most 2 reads",
                Box::new(|d| d.steady = counts(&[("list", "pods", 5), ("delete", "x", 2)])),
            ),
            (
                "churn: lag",
                Box::new(|d| {
                    d.churn
                        .as_mut()
                        .unwrap()
                        .lags
                        .push((EventKind::TtlPassed, Some(0.3)))
                }),
            ),
            (
                "churn: at most 1.0 read",
                Box::new(|d| d.churn.as_mut().unwrap().requests = counts(&[("get", "pods", 11)])),
            ),
            (
                "churn: at most 100 KiB",
                Box::new(|d| d.churn.as_mut().unwrap().list_bytes = 1001.0 * 1024.0),
            ),
            (
                "churn: API server CPU",
                Box::new(|d| d.churn.as_mut().unwrap().apiserver_cpu_s = 0.7),
            ),
            (
                "idle",
                Box::new(|d| d.idle.as_mut().unwrap().list_bytes = 1.0),
            ),
        ];
        assert_eq!(cases.len(), TARGETS.len());
        for (prefix, spoil) in cases {
            let mut run = good_run();
            spoil(&mut run[0].contenders[0]);
            let judged = judge(&run);
            for row in judged {
                let expected = if row.promise.starts_with(prefix) {
                    Verdict::Missed
                } else {
                    Verdict::Met
                };
                assert_eq!(
                    row.verdict, expected,
                    "{prefix}: {}: {}",
                    row.promise, row.shown
                );
            }
        }
    }

    #[test]
    fn a_run_without_the_phase_or_size_does_not_measure_it() {
        let mut run = good_run();
        run[0].n = 1_000;
        run[0].contenders[0].churn = None;
        let verdicts = verdicts(&run);
        // Memory is set at N = 10,000 only; the churn rows need a churn.
        assert_eq!(verdicts[0], Verdict::NotMeasured);
        assert!(verdicts[5..9].iter().all(|v| *v == Verdict::NotMeasured));
        assert_eq!(verdicts[1], Verdict::Met);
    }

    #[test]
    fn a_churn_only_build_is_not_the_one_judged() {
        let mut run = good_run();
        let mut before = run[0].contenders[0].clone();
        before.churn_only = true;
        before.ready_s = Some(99.0);
        run[0].contenders.insert(0, before);
        assert!(verdicts(&run).iter().all(|v| *v == Verdict::Met));
    }

    #[test]
    fn bounds_are_strict_or_inclusive_as_named() {
        let at = |value| Reading {
            value,
            against: None,
            shown: String::new(),
        };
        assert!(!Bound::Below(0.25).holds(&at(0.25)));
        assert!(Bound::AtMost(1.0).holds(&at(1.0)));
        assert!(!Bound::AtMostMeasured.holds(&at(0.0)));
        assert!(Bound::AtMostMeasured.holds(&Reading {
            against: Some(0.1),
            ..at(0.1)
        }));
    }
}

mod record_tests {
    use crate::results::{Contender, EventKind, Machine, Measured, Run, Settings, SizeResult};

    /// `--report-from` renders the report again from the JSON a run wrote: every figure must
    /// come back as it was measured.
    #[test]
    fn a_run_reads_back_from_its_json_as_it_was_written() {
        let run = Run {
            started: chrono::DateTime::from_timestamp(1_796_169_600, 0).expect("a valid instant"),
            command: "cargo bench --bench reclaim -- --sizes 10000".into(),
            settings: Settings {
                namespaces: 20,
                ttl_s: 30,
                events: None,
                rate: 8.0,
                sweep_interval_s: 30,
                concurrency: 48,
            },
            machine: Machine::default(),
            measured: Measured {
                src_diff: Some(0xfeed),
                ..Measured::default()
            },
            sizes: vec![SizeResult {
                n: 10_000,
                rate: 0.1 + 0.2,
                contenders: vec![Contender {
                    ready_s: Some(2.4409),
                    lags: vec![
                        (EventKind::OwnerDeleted, Some(0.007)),
                        (EventKind::TtlPassed, None),
                    ],
                    apiserver_cpu_s: 55.45,
                    ..Contender::default()
                }],
                ..SizeResult::default()
            }],
        };
        let text = serde_json::to_string_pretty(&run).expect("a run serializes");
        let back: Run = serde_json::from_str(&text).expect("and reads back");
        assert_eq!(
            serde_json::to_string_pretty(&back).expect("again"),
            text,
            "the figures changed on the way through JSON"
        );
        assert_eq!(
            back.sizes[0].contenders[0].lags,
            run.sizes[0].contenders[0].lags
        );
    }
}
