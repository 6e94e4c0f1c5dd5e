//! Statistics of the test kit, one definition each, for the soak (tests/soak/) and the
//! benchmark (bench/).

/// The `p` quantile (`p` from 0 to 1: 0.5 is the median, 0.99 the 99th percentile) of `sorted`,
/// which is in ascending order, by the nearest-rank method: the smallest value that at least a
/// fraction `p` of all values are at or below (rank `ceil(p * n)`, counted from 1). It is always
/// a value that was observed, never one interpolated between two; `p` = 0 gives the smallest.
/// `None` when there are no values.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

#[cfg(test)]
mod tests {
    #[test]
    fn nearest_rank_picks_an_observed_value() {
        let values: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(super::percentile(&values, 0.5), Some(5.0));
        assert_eq!(super::percentile(&values, 0.95), Some(10.0));
        assert_eq!(super::percentile(&values, 0.99), Some(10.0));
        assert_eq!(super::percentile(&values, 0.91), Some(10.0));
        assert_eq!(super::percentile(&values, 0.9), Some(9.0));
        // Not interpolated: the median of two values is the lower one.
        assert_eq!(super::percentile(&[1.0, 2.0], 0.5), Some(1.0));
    }

    #[test]
    fn the_ends_are_the_smallest_and_the_largest() {
        let values = [0.5, 1.5, 7.0];
        assert_eq!(super::percentile(&values, 0.0), Some(0.5));
        assert_eq!(super::percentile(&values, 1.0), Some(7.0));
        assert_eq!(super::percentile(&[3.0], 0.5), Some(3.0));
    }

    #[test]
    fn no_values_have_no_percentile() {
        assert_eq!(super::percentile(&[], 0.5), None);
    }
}
