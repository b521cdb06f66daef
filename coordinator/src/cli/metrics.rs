//! `/metrics` on the live page: the embedded broker's counters as
//! Prometheus text, and a line saying whether this process runs one.

/// The page's `/metrics` body.
pub fn prometheus() -> String {
    match crate::runtime::broker::running_counters() {
        Some(c) => format!("tunefleet_broker_embedded 1\n{}", c.prometheus()),
        None => "# the broker is external (or not started yet): its own metrics are its operator's\n\
                 tunefleet_broker_embedded 0\n"
            .to_string(),
    }
}
