//! [`Format`]: Prometheus text 0.0.4 or OpenMetrics 1.0.0, as the scraper's `Accept` asks.

use fastmetrics::format::text::TextProfile;

/// The exposition format, from the scraper's `Accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `text/plain; version=0.0.4` (the default).
    Prometheus,
    /// `application/openmetrics-text; version=1.0.0`.
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when `Accept` lists `application/openmetrics-text` with a non-zero
    /// quality at least as high as any `text/plain`; else the Prometheus text format.
    pub fn from_accept(accept: Option<&str>) -> Format {
        let Some(accept) = accept else {
            return Format::Prometheus;
        };
        let (mut om, mut plain) = (0.0f32, 0.0f32);
        for item in accept.split(',') {
            let mut parts = item.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.strip_prefix("q="))
                .find_map(|q| q.parse::<f32>().ok())
                .unwrap_or(1.0);
            match media.as_str() {
                "application/openmetrics-text" => om = om.max(q),
                "text/plain" | "*/*" => plain = plain.max(q),
                _ => {}
            }
        }
        if om > 0.0 && om >= plain {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    pub(super) fn profile(self) -> TextProfile {
        match self {
            Format::Prometheus => TextProfile::PrometheusV0_0_4,
            Format::OpenMetrics => TextProfile::default(),
        }
    }
}
