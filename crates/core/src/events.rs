//! client-go's event-correlator constants (`tools/record/events_cache.go`), shared by the
//! worker's local correlator and the queue service's shared one, so both gate events alike;
//! and what the shared one takes and answers ([`GateEvent`], [`Gated`]).

use std::time::Duration;

/// Events a source may send about one object at once (client-go `defaultSpamBurst`).
pub const SPAM_BURST: u32 = 25;
/// Refill of that allowance: one event every 5 minutes (client-go `defaultSpamQPS`, 1/300).
pub const SPAM_REFILL_PERIOD: Duration = Duration::from_secs(300);
/// Similar events (differing only by message) seen before they are combined (client-go
/// `defaultAggregateMaxEvents`).
pub const AGGREGATE_MAX_EVENTS: u32 = 10;
/// How long similar events are remembered for combining (client-go
/// `defaultAggregateIntervalInSeconds`).
pub const AGGREGATE_INTERVAL: Duration = Duration::from_secs(600);
/// Prefix of a combined event's message (client-go `EventAggregatorByReasonMessageFunc`).
pub const AGGREGATE_PREFIX: &str = "(combined from similar events): ";
/// Most events in one GateEvents call (one script call: bounds its run time); the worker's
/// event writer gates at most this many at once.
pub const MAX_GATE_EVENTS: usize = 256;
/// Longest event message GateEvents accepts: 4 KiB, room above the API server's 1 KiB `note`
/// limit (the writer truncates what it writes, not what it correlates); an event with a longer
/// message is correlated by the worker alone.
pub const MAX_GATED_MESSAGE_BYTES: usize = 4096;

/// One event before correlation, as the shared aggregator and spam filter take it (the keys are
/// client-go's, built by the recorder: `getSpamKey`, `EventAggregatorByReasonFunc`,
/// `getEventKey`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GateEvent {
    /// Key of the involved object (`namespace/name`): where its state lives.
    pub object_key: String,
    /// `getSpamKey`: source and involved object.
    pub spam_key: String,
    /// `EventAggregatorByReasonFunc`'s aggregate key.
    pub aggregate_key: String,
    /// `getEventKey`: the correlation key of an event that is not combined.
    pub event_key: String,
    /// The message (the aggregator's local key).
    pub message: String,
}

/// What the correlator made of one event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gated {
    /// The spam filter dropped it.
    pub dropped: bool,
    /// It is combined with similar events.
    pub aggregated: bool,
    /// Correlation key to count it under: the event key, or the aggregate key when combined.
    pub key: String,
    /// Message to write: the event's, or the combined one.
    pub message: String,
}

impl Gated {
    /// The aggregated form of `ev` (`EventAggregate`'s result) and the filter's verdict.
    pub fn of(ev: &GateEvent, aggregated: bool, dropped: bool) -> Self {
        let (key, message) = if aggregated {
            (ev.aggregate_key.clone(), format!("{AGGREGATE_PREFIX}{}", ev.message))
        } else {
            (ev.event_key.clone(), ev.message.clone())
        };
        Self { dropped, aggregated, key, message }
    }
}
