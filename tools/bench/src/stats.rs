//! Percentiles, summaries and CDF points over latency samples (seconds).

/// Summary of a set of samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub count: usize,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
    /// Arithmetic mean.
    pub mean: f64,
}

/// The `q`-quantile (0 ≤ q ≤ 1) of ascending `sorted` samples by the nearest-rank method, so
/// the answer is always a value that was measured.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let q = q.clamp(0.0, 1.0);
    // Nearest rank: the smallest value with at least q·n samples at or below it.
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.saturating_sub(1).min(sorted.len() - 1)])
}

/// Sorts `samples` (NaNs dropped) and summarises them; `None` when there are none.
pub fn summarize(samples: &mut Vec<f64>) -> Option<Summary> {
    samples.retain(|v| !v.is_nan());
    samples.sort_by(f64::total_cmp);
    let count = samples.len();
    let mean = samples.iter().sum::<f64>() / count as f64;
    Some(Summary {
        count,
        p50: percentile(samples, 0.50)?,
        p99: percentile(samples, 0.99)?,
        max: *samples.last()?,
        mean,
    })
}

/// Points `(value, fraction ≤ value)` of the empirical CDF of ascending `sorted`, thinned to
/// at most `max_points` (always keeping the last) so plots of 20,000 samples stay small.
pub fn cdf_points(sorted: &[f64], max_points: usize) -> Vec<(f64, f64)> {
    let n = sorted.len();
    if n == 0 || max_points == 0 {
        return Vec::new();
    }
    let step = n.div_ceil(max_points).max(1);
    let mut out: Vec<(f64, f64)> =
        (step - 1..n).step_by(step).map(|i| (sorted[i], (i + 1) as f64 / n as f64)).collect();
    if out.last().map(|p| p.1) != Some(1.0) {
        out.push((sorted[n - 1], 1.0));
    }
    out
}

/// `count / secs`, or 0 for an empty interval (a phase that did nothing has no rate).
pub fn rate(count: u64, secs: f64) -> f64 {
    if secs > 0.0 { count as f64 / secs } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), Some(50.0));
        assert_eq!(percentile(&v, 0.99), Some(99.0));
        assert_eq!(percentile(&v, 1.0), Some(100.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
        assert_eq!(percentile(&[], 0.5), None);
        // Small sets: p99 of 10 samples is the largest.
        let ten: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&ten, 0.99), Some(10.0));
        assert_eq!(percentile(&ten, 0.5), Some(5.0));
    }

    #[test]
    fn summary_sorts_and_drops_nan() {
        let mut v = vec![3.0, f64::NAN, 1.0, 2.0];
        let s = summarize(&mut v).unwrap();
        assert_eq!(v, vec![1.0, 2.0, 3.0]);
        assert_eq!((s.count, s.p50, s.p99, s.max), (3, 2.0, 3.0, 3.0));
        assert!((s.mean - 2.0).abs() < 1e-12);
        assert_eq!(summarize(&mut vec![]), None);
    }

    #[test]
    fn cdf_is_thinned_monotone_and_ends_at_one() {
        let v: Vec<f64> = (0..20_000).map(|i| i as f64 / 1000.0).collect();
        let pts = cdf_points(&v, 200);
        assert!(pts.len() <= 201, "{}", pts.len());
        assert!(pts.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
        assert_eq!(pts.last(), Some(&(19.999, 1.0)));
        assert_eq!(cdf_points(&[1.0, 2.0], 10), vec![(1.0, 0.5), (2.0, 1.0)]);
        assert!(cdf_points(&[], 10).is_empty());
    }

    #[test]
    fn rate_of_empty_interval_is_zero() {
        assert_eq!(rate(100, 2.0), 50.0);
        assert_eq!(rate(100, 0.0), 0.0);
    }
}
