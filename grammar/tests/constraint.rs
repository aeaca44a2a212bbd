//! The grammar engine over a real byte-level BPE vocabulary (trained here, as a model's is):
//! random walks that take any token a mask allows always spell text the grammar accepts, a
//! completed grammar allows only the end of the turn, biases add to logits, and a schema that
//! cannot compile is refused with llguidance's reason.

use mlxcel_grammar::{Grammar, Grammars, JsonStyle, Verdict};
use serde_json::{Value, json};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, TokenizerBuilder, TokenizerImpl};

/// A small byte-level BPE trained on JSON-ish text, with `<|im_end|>` (id 0) as its end of turn.
fn tokenizer_json() -> String {
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(600)
        .min_frequency(1)
        .show_progress(false)
        .special_tokens(vec![AddedToken::from("<|im_end|>", true)])
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut tokenizer: TokenizerImpl<
        BPE,
        NormalizerWrapper,
        ByteLevel,
        PostProcessorWrapper,
        ByteLevelDecoder,
    > = TokenizerBuilder::new()
        .with_model(BPE::default())
        .with_normalizer(None)
        .with_pre_tokenizer(Some(ByteLevel::default()))
        .with_post_processor(None)
        .with_decoder(Some(ByteLevelDecoder::default()))
        .build()
        .unwrap();
    let corpus: Vec<String> = (0..200)
        .map(|i| {
            format!(
                "{{\"name\": \"person {i}\", \"age\": {}, \"pets\": [{{\"kind\": \"cat\", \"legs\": 4}}], \
                 \"city\": \"Paris\", \"ok\": true, \"note\": null}} <tool_call> hello world {i}",
                i % 90
            )
        })
        .collect();
    tokenizer.train(&mut trainer, corpus.iter()).unwrap();
    tokenizer.to_string(false).unwrap()
}

/// SplitMix64, for reproducible walks.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Walks `grammar` taking a random allowed token each step (the end of turn when it is the
/// only choice, or when allowed and the walk is long); returns the text and whether the
/// grammar completed.
fn walk(
    grammars: &Grammars,
    grammar: &Grammar,
    seed: u64,
    text_of: &dyn Fn(&[u32]) -> String,
) -> (String, bool) {
    walk_within(grammars, grammar, seed, text_of, (400, 150))
}

/// [`walk`] with a limit of `limit` tokens, taking the end of turn only when it is the only
/// choice or after `lingers` steps.
fn walk_within(
    grammars: &Grammars,
    grammar: &Grammar,
    seed: u64,
    text_of: &dyn Fn(&[u32]) -> String,
    (limit, lingers): (usize, usize),
) -> (String, bool) {
    let mut c = grammars.constraint(Some(grammar), Vec::new()).unwrap();
    let mut rng = Rng(seed);
    let mut ids = Vec::new();
    for step in 0..limit {
        c.prepare(limit - step).unwrap();
        let mut logits = vec![0f32; grammars.vocab()];
        c.apply(&mut logits);
        let allowed: Vec<u32> = (0..logits.len() as u32)
            .filter(|&t| logits[t as usize].is_finite())
            .collect();
        assert!(!allowed.is_empty(), "a mask allowed nothing");
        let pick = if allowed.contains(&0) && (allowed.len() == 1 || step > lingers) {
            0
        } else {
            let choices: Vec<u32> = allowed.iter().copied().filter(|&t| t != 0).collect();
            choices[(rng.next() % choices.len() as u64) as usize]
        };
        let verdict = c.accept(pick).unwrap();
        if pick != 0 {
            ids.push(pick);
        }
        if verdict == Verdict::Complete {
            return (text_of(&ids), true);
        }
    }
    (text_of(&ids), false)
}

fn setup() -> (Grammars, impl Fn(&[u32]) -> String) {
    let json = tokenizer_json();
    let grammars = Grammars::new(&json, &[0], 640).unwrap();
    assert_eq!(grammars.vocab(), 640, "padded to the model's logits");
    let tokenizer: tokenizers::Tokenizer = json.parse().unwrap();
    let text_of = move |ids: &[u32]| tokenizer.decode(ids, false).unwrap();
    (grammars, text_of)
}

#[test]
fn random_walks_through_a_schema_spell_valid_json() {
    let (grammars, text_of) = setup();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "pets": {"type": "array", "maxItems": 2, "items": {
                "type": "object",
                "properties": {"kind": {"enum": ["cat", "dog"]}, "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
                "required": ["kind", "legs"]}},
        },
        "required": ["name", "age", "pets"]
    });
    let grammar = Grammar::json_schema(&schema, JsonStyle::Python, true);
    grammars.check(&grammar).unwrap();
    for seed in 0..20 {
        let (text, complete) = walk(&grammars, &grammar, seed, &text_of);
        assert!(complete, "seed {seed}: the walk never completed: {text:?}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let age = v["age"].as_i64().unwrap();
        assert!((0..=120).contains(&age), "{text}");
        assert!(v["name"].as_str().unwrap().chars().count() <= 12, "{text}");
        assert!(
            v.as_object().unwrap().len() == 3,
            "strict: no other keys: {text}"
        );
        for pet in v["pets"].as_array().unwrap() {
            assert!(
                ["cat", "dog"].contains(&pet["kind"].as_str().unwrap()),
                "{text}"
            );
        }
        // Spaced as Python's json.dumps writes it.
        assert!(text.starts_with("{\"name\": "), "{text}");
    }
}

#[test]
fn an_unbounded_grammar_lands_within_its_token_limit() {
    let (grammars, text_of) = setup();
    let any_object = Grammar::json_object(JsonStyle::Python);
    for seed in 0..20 {
        // A walker that never chooses to stop: only landing ends it in time.
        let (text, complete) =
            walk_within(&grammars, &any_object, seed, &text_of, (96, usize::MAX));
        assert!(
            complete,
            "seed {seed}: no landing within 96 tokens: {text:?}"
        );
        // JSON (a number may be out of f64's range: checked as syntax, not as a value).
        serde_json::from_str::<serde::de::IgnoredAny>(&text)
            .unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(text.starts_with('{') && text.ends_with('}'), "{text}");
    }
}

#[test]
fn a_lark_grammar_with_an_embedded_schema_forces_a_tool_call() {
    let (grammars, text_of) = setup();
    let rules = format!(
        "start: \"<tool_call>\\n\" %json {} \"\\n</tool_call>\"\n",
        json!({"type": "object", "properties": {"name": {"const": "f"}, "arguments": {"type": "object",
            "properties": {"x": {"type": "integer"}}, "required": ["x"], "additionalProperties": false}},
            "required": ["name", "arguments"], "additionalProperties": false,
            "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}})
    );
    let grammar = Grammar::lark(rules);
    grammars.check(&grammar).unwrap();
    let (text, complete) = walk(&grammars, &grammar, 7, &text_of);
    assert!(complete, "{text:?}");
    let body = text
        .strip_prefix("<tool_call>\n")
        .and_then(|t| t.strip_suffix("\n</tool_call>"))
        .unwrap_or_else(|| panic!("{text:?}"));
    assert!(
        body.starts_with("{\"name\": \"f\", \"arguments\": {\"x\": "),
        "{body}"
    );
    let v: Value = serde_json::from_str(body).unwrap();
    assert!(v["arguments"]["x"].is_i64());
}

#[test]
fn biases_add_to_logits_and_a_schema_that_cannot_compile_says_why() {
    let (grammars, _) = setup();
    let c = grammars
        .constraint(None, vec![(5, 2.5), (7, -100.0)])
        .unwrap();
    let mut logits = vec![1.0f32; grammars.vocab()];
    c.apply(&mut logits);
    assert_eq!((logits[5], logits[7], logits[6]), (3.5, -99.0, 1.0));
    let mut row = Vec::new();
    c.bias_row(8, &mut row);
    assert_eq!(row[5], 2.5);
    let bad = Grammar::json_schema(&json!({"type": "strin"}), JsonStyle::Python, false);
    let e = grammars.check(&bad).unwrap_err().to_string();
    assert!(e.contains("strin"), "{e}");
    let e = grammars
        .check(&Grammar::lark("start: foo\n".into()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("foo"), "{e}");
}
