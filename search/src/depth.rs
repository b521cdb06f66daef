//! How many of a study's trials were in flight (created and not told:
//! running, held ahead on an agent or queued) each time its search was
//! asked for the next one: the deeper, the more of the study a
//! model-based search chose without the results it waits for. Counted, not
//! assumed, so a study's summary can say what its asks saw.

/// Depths past this are counted as this one.
const MOST: usize = 1024;

/// The depth of each ask, as counts per depth.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AskDepth {
    /// `counts[d]`: asks made with `d` trials in flight.
    counts: Vec<u64>,
}

impl AskDepth {
    /// One ask made with `depth` trials in flight.
    pub fn record(&mut self, depth: usize) {
        let d = depth.min(MOST);
        if self.counts.len() <= d {
            self.counts.resize(d + 1, 0);
        }
        self.counts[d] += 1;
    }

    /// Asks recorded.
    pub fn asks(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The median depth (the lower one of an even count); `None` before any ask.
    pub fn median(&self) -> Option<usize> {
        let half = self.asks().checked_sub(1)? / 2;
        let mut seen = 0;
        self.counts.iter().position(|c| {
            seen += c;
            seen > half
        })
    }

    /// The deepest ask; `None` before any.
    pub fn max(&self) -> Option<usize> {
        self.counts.iter().rposition(|c| *c > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_and_the_deepest_ask_are_counted() {
        let mut d = AskDepth::default();
        assert_eq!((d.median(), d.max(), d.asks()), (None, None, 0));
        for depth in [0, 3, 3, 5, 9, 4] {
            d.record(depth);
        }
        assert_eq!((d.median(), d.max(), d.asks()), (Some(3), Some(9), 6));
        d.record(4);
        assert_eq!(d.median(), Some(4), "0 3 3 4 4 5 9");
        d.record(usize::MAX);
        assert_eq!(d.max(), Some(MOST));
    }
}
