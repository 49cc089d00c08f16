//! How families reach `fastmetrics`: [`Families`] registers each under the `vramfork_`
//! prefix for one format (a counter's `_total`, a unit's suffix), from plain rows of
//! labels and values read off the snapshot.

use fastmetrics::encoder::{EncodeMetric, MetricEncoder};
use fastmetrics::raw::bucket::Bucket;
use fastmetrics::raw::{MetricLabelSet, MetricType, TypedMetric, Unit};
use fastmetrics::registry::Registry;

use super::Format;
use crate::metrics::histogram::Hist;

pub(super) type Labels = Vec<(&'static str, String)>;

/// A family read off rows of `R`: name, help, and the value of one row.
pub(super) type Family<R, V> = (&'static str, &'static str, fn(&R) -> V);

#[derive(Debug, Clone)]
enum Value {
    Counter(u64),
    Gauge(f64),
    Histogram(Hist),
}

struct Point<'a>(&'a Value);

impl EncodeMetric for Point<'_> {
    fn encode(&self, e: &mut dyn MetricEncoder) -> fastmetrics::error::Result<()> {
        match self.0 {
            Value::Counter(n) => e.encode_counter(n, None, None),
            Value::Gauge(g) => e.encode_gauge(g),
            Value::Histogram(h) => {
                let buckets: Vec<Bucket> = h.buckets().map(|(le, n)| Bucket::new(le, n)).collect();
                e.encode_histogram(&buckets, None, h.count(), h.sum, None)
            }
        }
    }
}

/// One family's rows; `KIND` picks the metric type (0 counter, 1 gauge, 2 histogram).
struct Rows<const KIND: u8>(Vec<(Labels, Value)>);

impl<const KIND: u8> TypedMetric for Rows<KIND> {
    const TYPE: MetricType = match KIND {
        0 => MetricType::Counter,
        1 => MetricType::Gauge,
        _ => MetricType::Histogram,
    };
}

impl<const KIND: u8> MetricLabelSet for Rows<KIND> {
    type LabelSet = ();
}

impl<const KIND: u8> EncodeMetric for Rows<KIND> {
    fn encode(&self, e: &mut dyn MetricEncoder) -> fastmetrics::error::Result<()> {
        for (labels, v) in &self.0 {
            e.encode(labels, &Point(v))?;
        }
        Ok(())
    }

    /// A family is declared (`# HELP`, `# TYPE`) even with no rows yet (no GPU, no CUDA
    /// worker), so that every scrape lists every family.
    fn is_empty(&self) -> bool {
        false
    }
}

/// Registers families under the `vramfork_` prefix for one format.
pub(super) struct Families {
    pub(super) reg: Registry,
    pub(super) format: Format,
}

impl Families {
    /// A counter: `name` without `_total`. The Prometheus text format wants the family
    /// named with its `_total` sample; OpenMetrics names the family without it and adds it
    /// to the sample.
    pub(super) fn counter(&mut self, name: &str, help: &'static str, rows: Vec<(Labels, u64)>) {
        let name = match self.format {
            Format::Prometheus => format!("{name}_total"),
            Format::OpenMetrics => name.to_string(),
        };
        let rows = rows
            .into_iter()
            .map(|(l, n)| (l, Value::Counter(n)))
            .collect();
        self.add(name, help, None, Rows::<0>(rows));
    }

    pub(super) fn gauge(
        &mut self,
        name: &str,
        help: &'static str,
        unit: Option<Unit>,
        rows: Vec<(Labels, f64)>,
    ) {
        let rows = rows
            .into_iter()
            .map(|(l, g)| (l, Value::Gauge(g)))
            .collect();
        self.add(name.to_string(), help, unit, Rows::<1>(rows));
    }

    pub(super) fn histogram(&mut self, name: &str, help: &'static str, rows: Vec<(Labels, Hist)>) {
        let rows = rows
            .into_iter()
            .map(|(l, h)| (l, Value::Histogram(h)))
            .collect();
        self.add(name.to_string(), help, Some(Unit::Seconds), Rows::<2>(rows));
    }

    fn add<const K: u8>(
        &mut self,
        name: String,
        help: &'static str,
        unit: Option<Unit>,
        rows: Rows<K>,
    ) {
        // Names are this module's constants: a failure is a bug caught by the tests.
        self.reg
            .register_metric(name, help, unit, rows)
            .expect("metric families are registered once with valid names");
    }
}

/// Strips a unit suffix that fastmetrics adds back from the unit (`_bytes`, `_seconds`).
fn unit_name(name: &str, unit: &Unit) -> String {
    let suffix = format!("_{}", unit.as_str());
    name.strip_suffix(&suffix).unwrap_or(name).to_string()
}

pub(super) fn l(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

impl Families {
    /// A gauge in bytes: `name` ends in `_bytes`, which fastmetrics adds back from the unit.
    pub(super) fn gauge_bytes(&mut self, name: &str, help: &'static str, rows: Vec<(Labels, f64)>) {
        let unit = Unit::Bytes;
        let base = unit_name(name, &unit);
        self.gauge(&base, help, Some(unit), rows);
    }
}
