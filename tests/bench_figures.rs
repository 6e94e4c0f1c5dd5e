//! Unit tests of the benchmark's figures (bench/): its statistics, its targets table and its
//! plots, on figures made up here. The benchmark's modules are included by path (a bench target is no
//! library); the benchmark itself needs a control plane and an hour.

// The whole record of a run is the benchmark's; these tests read its figures and its JSON.
// Only its pure parts are tested here; sending the lists needs a control plane.
#[allow(dead_code)]
#[path = "../bench/plain.rs"]
mod plain;
#[path = "../bench/plots.rs"]
mod plots;
#[allow(dead_code)]
#[path = "../bench/results.rs"]
mod results;
#[path = "../bench/statistics.rs"]
mod statistics;
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

    #[test]
    fn writes_per_claim_count_every_mutating_verb_and_no_read() {
        let counts = counts(&[
            ("delete", "persistentvolumeclaims", 10),
            ("create", "events", 10),
            ("patch", "leases", 9),
            ("update", "leases", 1),
            ("get", "leases", 40),
            ("list", "pods", 3),
            ("watch", "pods", 2),
        ]);
        assert_eq!(writes_per_claim(&counts, 10), Some(3.0));
        assert_eq!(writes_per_claim(&counts, 0), None);
    }

    #[test]
    fn the_distribution_steps_once_per_reclaimed_claim_and_ends_below_one_for_a_miss() {
        let lags = [
            (OWNER, Some(0.5)),
            (TTL, None),
            (OWNER, Some(-0.001)),
            (TTL, Some(2.0)),
        ];
        assert_eq!(cdf(&lags), [(-0.001, 0.25), (0.5, 0.5), (2.0, 0.75)]);
        assert!(cdf(&[(OWNER, None)]).is_empty());
    }

    #[test]
    fn a_ratio_needs_a_positive_whole() {
        assert_eq!(ratio(2.6, 2.0), Some(1.3));
        assert_eq!(ratio(2.6, 0.0), None);
    }

    #[test]
    fn each_churn_is_one_point_of_lag_against_reads() {
        use crate::results::{Role, Steady};
        let churn = |reads: u64, lags: Vec<Option<f64>>| Steady {
            requests: counts(&[
                ("list", "pods", reads),
                ("get", "leases", 100),
                ("delete", "persistentvolumeclaims", 2),
                ("patch", "leases", 2),
            ]),
            lags: lags.into_iter().map(|lag| (TTL, lag)).collect(),
            ..Steady::default()
        };
        let contender = |name: &str, role, churn| Contender {
            name: name.into(),
            role,
            churn,
            ..Contender::default()
        };
        let r = SizeResult {
            contenders: vec![
                contender(
                    "fast",
                    Role::Daemon,
                    Some(churn(8, vec![Some(0.1), Some(0.2)])),
                ),
                contender("no churn", Role::Daemon, None),
                contender("none reclaimed", Role::Daemon, Some(churn(1, vec![None]))),
                contender(
                    "Kubernetes GC",
                    Role::Gc,
                    Some(churn(2, vec![Some(0.01), None])),
                ),
            ],
            ..SizeResult::default()
        };
        let points = tradeoffs(&r);
        let names: Vec<&str> = points.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["fast", "Kubernetes GC"]);
        assert_eq!((points[0].reads, points[0].writes), (4.0, 2.0));
        assert_eq!(points[0].lag.p99, Some(0.2));
        assert_eq!(points[1].role, Role::Gc);
        assert_eq!((points[1].reads, points[1].writes), (2.0, 4.0));
        assert!(!points[1].lag.complete());
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
    use crate::results::{
        Contender, Counts, EventKind, PlainLists, ProcSample, Role, SizeResult, Steady,
    };
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
                ("create", "events", 2),
            ]),
            plain_lists: Some(PlainLists {
                wall_s: 1.6,
                ..PlainLists::default()
            }),
            at_end: Some(ProcSample {
                hwm_kib: 60 * 1024,
                ..ProcSample::default()
            }),
            churn: Some(churn(
                10,
                counts(&[
                    ("get", "leases", 40),
                    ("list", "pods", 5),
                    ("delete", "persistentvolumeclaims", 10),
                    ("create", "events", 10),
                    ("patch", "leases", 1),
                ]),
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
                "scale: ready at most 1.3×",
                Box::new(|d| d.plain_lists.as_mut().unwrap().wall_s = 1.5),
            ),
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
                "burst: at most 2.1 writes",
                Box::new(|d| {
                    d.steady = counts(&[
                        ("delete", "persistentvolumeclaims", 2),
                        ("create", "events", 2),
                        ("patch", "leases", 1),
                    ])
                }),
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
                "churn: at most 2.1 writes",
                Box::new(|d| {
                    d.churn.as_mut().unwrap().requests = counts(&[
                        ("delete", "persistentvolumeclaims", 10),
                        ("create", "events", 10),
                        ("patch", "leases", 2),
                    ])
                }),
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
        run[0].contenders[0].plain_lists = None;
        // Memory is set at N = 10,000 only; the churn rows need a churn, the ratio the plain
        // client's lists; the rest is measured at the largest size.
        for row in judge(&run) {
            let expected = if row.promise.starts_with("memory")
                || row.promise.starts_with("churn")
                || row.promise.contains("plain client")
            {
                assert_eq!(row.shown, "not measured in this run");
                Verdict::NotMeasured
            } else {
                Verdict::Met
            };
            assert_eq!(row.verdict, expected, "{}", row.promise);
        }
    }

    #[test]
    fn ready_is_judged_against_the_plain_lists_at_every_size_by_the_worst() {
        let mut run = good_run();
        let mut large = run[0].clone();
        large.n = 50_000;
        large.contenders[0].ready_s = Some(9.0);
        large.contenders[0].plain_lists = Some(PlainLists {
            wall_s: 6.0,
            ..PlainLists::default()
        });
        run.push(large);
        let row = judge(&run)
            .into_iter()
            .find(|row| row.promise.contains("plain client"))
            .expect("the ratio's row");
        assert_eq!(row.verdict, Verdict::Missed);
        assert_eq!(
            row.shown,
            "1.25× at N = 10,000 (2.00 s against 1.60 s); 1.50× at N = 50,000 (9.00 s against \
             6.00 s)"
        );
        // A size that did not measure the plain lists is left out, not counted as a miss.
        run[1].contenders[0].plain_lists = None;
        let met = judge(&run)
            .into_iter()
            .find(|row| row.promise.contains("plain client"))
            .expect("the ratio's row");
        assert_eq!(met.verdict, Verdict::Met);
        assert_eq!(met.shown, "1.25× at N = 10,000 (2.00 s against 1.60 s)");
    }

    #[test]
    fn writes_are_shown_by_what_they_write() {
        let row = judge(&good_run())
            .into_iter()
            .find(|row| row.promise.starts_with("churn: at most 2.1 writes"))
            .expect("the churn's writes");
        assert_eq!(row.shown, "2.10 (DELETE 1.00, Event 1.00, Lease 0.10)");
        assert_eq!(row.verdict, Verdict::Met);
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

    /// A run recorded before the plain client's lists were measured still renders: the figure
    /// is absent, and the report says it was not measured.
    #[test]
    fn a_contender_recorded_before_the_plain_lists_reads_without_them() {
        let mut value = serde_json::to_value(Contender::default()).expect("serializes");
        let fields = value.as_object_mut().expect("an object");
        assert!(fields.remove("plain_lists").is_some());
        let back: Contender = serde_json::from_value(value).expect("reads without it");
        assert!(back.plain_lists.is_none());
    }
}

mod plot_tests {
    use crate::plots::*;
    use crate::results::{
        Contender, EventKind, Machine, Measured, Role, Run, Settings, SizeResult, Steady,
    };

    fn contender(name: &str, role: Role, lags: &[Option<f64>], churn: bool) -> Contender {
        let lags: Vec<_> = lags.iter().map(|l| (EventKind::OwnerDeleted, *l)).collect();
        Contender {
            name: name.into(),
            role,
            churn: churn.then(|| Steady {
                lags: lags.clone(),
                requests: super::counts(&[("list", "pods", 1), ("delete", "x", 2)]),
                ..Steady::default()
            }),
            lags,
            ..Contender::default()
        }
    }

    fn run(sizes: Vec<SizeResult>) -> Run {
        Run {
            started: chrono::DateTime::from_timestamp(0, 0).expect("an instant"),
            command: String::new(),
            settings: Settings {
                namespaces: 1,
                ttl_s: 1,
                events: None,
                rate: 1.0,
                sweep_interval_s: 1,
                concurrency: 1,
            },
            machine: Machine::default(),
            measured: Measured::default(),
            sizes,
        }
    }

    #[test]
    fn each_size_gets_its_distributions_and_where_it_churned_its_lag_against_reads() {
        let full = SizeResult {
            n: 10_000,
            contenders: vec![
                contender("Kubernetes GC", Role::Gc, &[Some(0.01), Some(0.02)], true),
                contender("workspace-gc", Role::Daemon, &[Some(-0.002), None], true),
                contender("sweep janitor (30 s)", Role::Sweep, &[Some(12.0)], true),
            ],
            ..SizeResult::default()
        };
        let burst_only = SizeResult {
            n: 50_000,
            contenders: vec![contender("workspace-gc", Role::Daemon, &[Some(3.0)], false)],
            ..SizeResult::default()
        };
        let figures = figures(&run(vec![full, burst_only])).expect("drawn");
        let files: Vec<&str> = figures.iter().map(|f| f.file.as_str()).collect();
        assert_eq!(
            files,
            [
                "lag-cdf-N10000.svg",
                "lag-reads-N10000.svg",
                "lag-cdf-N50000.svg"
            ]
        );
        let cdf = &figures[0];
        assert_eq!(cdf.kind, FigureKind::LagCdf);
        assert!(cdf.svg.starts_with("<svg"), "{}", &cdf.svg[..40]);
        for text in [
            "Burst, N = 10,000",
            "Churn, N = 10,000",
            "Kubernetes GC",
            "sweep janitor (30 s)",
            "workspace-gc",
        ] {
            assert!(cdf.svg.contains(text), "the distributions lack {text}");
        }
        assert!(
            figures[1]
                .svg
                .contains("reads (GET + LIST) per reclaimed claim")
        );
        assert!(figures[1].svg.contains("workspace-gc (1 not reclaimed)"));
        assert!(!figures[2].svg.contains("Churn"));
    }

    #[test]
    fn a_size_where_nothing_was_reclaimed_has_no_figure() {
        let nothing = SizeResult {
            n: 1_000,
            contenders: vec![contender("workspace-gc", Role::Daemon, &[None], false)],
            ..SizeResult::default()
        };
        assert_eq!(figures(&run(vec![nothing])), Ok(Vec::new()));
    }

    #[test]
    fn the_lag_axis_spans_whole_decades_from_the_floor() {
        assert_eq!(decades([0.013, 38.0]), (0.01, 100.0));
        assert_eq!(decades([-0.2, 0.5]), (LAG_FLOOR_S, 1.0));
        assert_eq!(decades([1.0]), (1.0, 10.0));
        assert_eq!(decades([]), (LAG_FLOOR_S, 1.0));
    }
}

mod plain_tests {
    use crate::plain::*;

    fn sent<'a>(verb: &'a str, resource: &'a str, uri: &'a str, code: u16) -> Sent<'a> {
        Sent {
            verb,
            resource,
            uri,
            code,
        }
    }

    #[test]
    fn the_initial_lists_are_the_streamed_ones_and_first_pages_once_each_by_resource() {
        let streamed = "/api/v1/pods?allowWatchBookmarks=true&resourceVersion=0&\
                        sendInitialEvents=true&resourceVersionMatch=NotOlderThan&watch=true";
        let floor = "/api/v1/pods?labelSelector=never&limit=1";
        let page = "/apis/tekton.dev/v1/pipelineruns?limit=500";
        let refused = streamed.replace("pods", "pipelineruns");
        let second_page = format!("{page}&continue=abc");
        let sent = [
            sent("get", "leases", "/apis/coordination.k8s.io/v1/x", 200),
            sent("list", "pods", floor, 200),
            sent("list", "pipelineruns", page, 200),
            sent("watch", "pods", streamed, 200),
            sent("watch", "pipelineruns", &refused, 422),
            sent("list", "pipelineruns", &second_page, 200),
            sent(
                "watch",
                "pipelineruns",
                "/apis/tekton.dev/v1/pipelineruns?watch=true",
                200,
            ),
            sent("list", "pods", floor, 200),
        ];
        assert_eq!(
            initial_lists(sent),
            [
                (
                    "pods".to_owned(),
                    vec![
                        Replay::Paged(floor.into()),
                        Replay::Streamed(streamed.into())
                    ]
                ),
                ("pipelineruns".to_owned(), vec![Replay::Paged(page.into())]),
            ]
        );
    }

    #[test]
    fn a_page_names_the_next_in_its_head() {
        let head = br#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"7","continue":"eyJ2Ijo_x-1"},"items":[{"#;
        assert_eq!(continue_token(head).as_deref(), Some("eyJ2Ijo_x-1"));
        let last = br#"{"kind":"PodList","metadata":{"resourceVersion":"7"},"items":[]}"#;
        assert_eq!(continue_token(last), None);
        assert_eq!(continue_token(br#"{"metadata":{"continue":""}}"#), None);
        assert_eq!(
            next_page(
                "/api/v1/pods?limit=500&continue=old&labelSelector=a%3Db",
                "new"
            ),
            "/api/v1/pods?limit=500&labelSelector=a%3Db&continue=new"
        );
        assert_eq!(next_page("/api/v1/pods", "t"), "/api/v1/pods?continue=t");
    }

    #[test]
    fn the_end_of_a_streamed_list_is_found_wherever_the_chunks_split_it() {
        let stream = br#"{"type":"ADDED","object":{}}
{"type":"BOOKMARK","object":{"metadata":{"annotations":{"k8s.io/initial-events-end":"true"}}}}
"#;
        for split in 0..stream.len() {
            for second in split..stream.len() {
                let mut search = EndSearch::default();
                let chunks = [&stream[..split], &stream[split..second], &stream[second..]];
                let at = chunks.iter().position(|chunk| search.found(chunk));
                assert!(at.is_some(), "missed when split at {split} and {second}");
            }
        }
        let mut search = EndSearch::default();
        assert!(!search.found(br#"{"annotations":{"k8s.io/initial-events-end":"false"}}"#));
        assert!(!search.found(b""));
    }
}
