//! Stop strings, matched on generated text across token boundaries.
//!
//! Text that could be the start of a stop string is held back until the next piece decides it,
//! so a stop string never leaks into the output, even split over several tokens.

/// Matches stop strings against the text stream.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet released.
    held: String,
    /// The stop string that matched.
    matched: Option<String>,
}

/// What may be released after a piece of text.
#[derive(Debug, PartialEq, Eq)]
pub struct Released {
    pub text: String,
    /// A stop string matched: `text` ends just before it and nothing follows.
    pub stopped: bool,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            matched: None,
        }
    }

    /// Adds `piece`; returns the text that can no longer be part of a stop string.
    pub fn push(&mut self, piece: &str) -> Released {
        self.held.push_str(piece);
        if let Some((at, stop)) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at)
        {
            self.matched = Some(stop.clone());
            let text = self.held[..at].to_string();
            self.held.clear();
            return Released {
                text,
                stopped: true,
            };
        }
        let keep = self.partial_suffix_len();
        let cut = self.held.len() - keep;
        let text = self.held[..cut].to_string();
        self.held.drain(..cut);
        Released {
            text,
            stopped: false,
        }
    }

    /// The stop string that ended the text, once one has.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// At the end of generation: everything still held back.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// The length of the longest suffix of `held` that is a proper prefix of some stop string.
    fn partial_suffix_len(&self) -> usize {
        let held = self.held.as_str();
        held.char_indices()
            .map(|(i, _)| &held[i..])
            .find(|suffix| self.stops.iter().any(|s| s.starts_with(suffix)))
            .map_or(0, str::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let r = m.push(p);
            out.push_str(&r.text);
            if r.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn a_stop_split_over_pieces_is_matched_and_not_leaked() {
        assert_eq!(
            run(&["END"], &["abc E", "N", "D more"]),
            ("abc ".into(), true)
        );
        assert_eq!(run(&["\n\n"], &["one\n", "\ntwo"]), ("one".into(), true));
    }

    #[test]
    fn held_text_is_released_when_it_stops_matching() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("xE").text, "x");
        assert_eq!(m.push("Nx").text, "ENx");
        assert_eq!(run(&["END"], &["E", "N"]), ("EN".into(), false));
    }

    #[test]
    fn the_earliest_of_several_stops_wins_and_multibyte_text_is_safe() {
        assert_eq!(run(&["b", "a"], &["xxab"]), ("xx".into(), true));
        assert_eq!(run(&["é!"], &["café", "!"]), ("caf".into(), true));
        assert_eq!(
            run(&["日本"], &["こんに日", "は"]),
            ("こんに日は".into(), false)
        );
    }
}
