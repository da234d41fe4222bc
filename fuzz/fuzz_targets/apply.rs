#![no_main]
//! The apply path against DynamoDB Local: the input draws a small spec
//! (index keys, copies, inverse edges, counters, rollups, aggregates, with
//! and without `when`) and a history of writes; the writes land in a fresh
//! table, their stream records are applied in batches (some delivered
//! twice) through the applier the worker uses, and the table must then be
//! what `tests/dynamo/oracle.rs` (which reads the spec's TOML, not
//! `src/plan`) computes from its source items, with no dead letter.
//!
//! Needs `AWS_ENDPOINT_URL` (`scripts/fuzz` starts DynamoDB Local for it).
//! A few executions per second: each creates and deletes a table.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use aws_sdk_dynamodb::types::AttributeValue as Av;
use ddb_projector::apply::{ApplyConfig, BatchOptions};
use ddb_projector::record::{
    ChangeKind, ChangeRecord, Image, Item, Origin, SequenceNumber, ViewType,
};
use ddb_projector::spec::Spec;
use libfuzzer_sys::fuzz_target;

#[path = "../../tests/dynamo/oracle.rs"]
#[allow(dead_code)]
mod oracle;

/// What `oracle.rs` takes from the tests' model.
mod model {
    pub type Attrs = std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>;

    #[allow(dead_code)]
    pub fn attrs(pairs: &[(&str, aws_sdk_dynamodb::types::AttributeValue)]) -> Attrs {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }
}

type Attrs = model::Attrs;

const ENTITIES: &str = r#"
service = "fuzzed"

[table]
name = "Fuzzed"

[entities.node]
pk = "N#{a}"
sk = "META"

[entities.attr]
pk = "N#{a}"
sk = "A#{b}"

[entities.link]
pk = "N#{a}"
sk = "L#{b}"

[entities.back]
pk = "N#{b}"
sk = "B#{a}"

[entities.tally]
pk = "T#{u}"
sk = "TALLY"
"#;

/// Reads the input a byte at a time (zeros once it is spent).
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn next(&mut self) -> u8 {
        match self.0.split_first() {
            Some((first, rest)) => {
                self.0 = rest;
                *first
            }
            None => 0,
        }
    }

    fn below(&mut self, n: u8) -> u8 {
        self.next() % n
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn when(b: u8) -> &'static str {
    match b % 3 {
        0 => "",
        1 => "when = { f = true }\n",
        _ => "when = { k = \"p\" }\n",
    }
}

/// A spec of one to four projections drawn from `input`.
fn spec_text(input: &mut Bytes) -> String {
    let mut text = ENTITIES.to_string();
    let mut counters = Vec::new();
    for id in 0..1 + input.below(4) {
        let (kind, v, w) = (input.below(6), input.next(), input.next());
        let body = match kind {
            0 => format!(
                "kind = \"index-keys\"\nentity = \"attr\"\nset = {{ i{id}p = \"X#{{lower(x)}}\"{} }}\n",
                if v % 2 == 0 { format!(", i{id}s = \"{{a}}#{{b}}\"") } else { String::new() }
            ),
            1 => format!(
                "kind = \"denormalize\"\nsource = \"attr\"\ntarget = \"node\"\n{}copy = {{ d{id} = \"{{x}}\" }}\n",
                when(w)
            ),
            2 => format!(
                "kind = \"inverse-edge\"\nsource = \"link\"\ntarget = \"back\"\n{}{}",
                when(w),
                if v % 2 == 0 { format!("copy = {{ e{id} = \"{{x}}\" }}\n") } else { String::new() }
            ),
            3 => {
                counters.push(id);
                format!(
                    "kind = \"counter\"\nsource = \"{}\"\nof = {{ u = \"{{{}}}\" }}\n{}shards = {}\n",
                    if v % 2 == 0 { "link" } else { "attr" },
                    if v / 2 % 2 == 0 { "a" } else { "b" },
                    when(w),
                    1 + v % 3
                )
            }
            4 => match counters.last() {
                Some(counter) => format!(
                    "kind = \"rollup\"\ncounter = \"p{counter}\"\ntarget = \"tally\"\nattribute = \"r{id}\"\n"
                ),
                None => continue,
            },
            _ => format!(
                "kind = \"aggregate\"\nsource = \"attr\"\ntarget = \"node\"\n{}set = {{ g{id}s = \"sum(n)\", g{id}c = \"count()\", g{id}m = \"max(x)\" }}\n",
                when(w)
            ),
        };
        text.push_str(&format!("[[projections]]\nname = \"p{id}\"\n{body}\n"));
    }
    text
}

/// The items the writes leave, and the stream records they make.
#[derive(Default)]
struct History {
    items: BTreeMap<(String, String), Attrs>,
    records: Vec<ddb_projector::record::ChangeRecord>,
}

impl History {
    fn record(&mut self, kind: ChangeKind, old: Option<&Attrs>, new: Option<&Attrs>) {
        let seq = self.records.len() as u64 + 1;
        let any = new.or(old).expect("an image");
        let mut keys = Item::default();
        for name in ["PK", "SK"] {
            keys.insert(name.to_string(), any[name].clone().into());
        }
        let image = |attrs: Option<&Attrs>| attrs.map(|a| Image::from(Item::from(a.clone())));
        self.records.push(ChangeRecord {
            event_id: format!("e{seq}"),
            kind,
            keys: keys.into(),
            old_image: image(old),
            new_image: image(new),
            sequence_number: SequenceNumber(format!("{seq:021}")),
            approximate_creation_ms: None,
            ttl_expiry: false,
            view_type: Some(ViewType::NewAndOldImages),
            size_bytes: None,
            origin: Origin::Synthetic,
        });
    }

    /// One write drawn from `input`: sources put and deleted, targets
    /// (nodes, tallies) created once.
    fn write(&mut self, input: &mut Bytes) {
        let (which, a, b, bits) = (input.below(5), input.below(3), input.below(3), input.next());
        let s = |v: String| Av::S(v);
        let (pk, sk) = match which {
            0 => (format!("N#v{a}"), "META".to_string()),
            1 => (format!("T#v{a}"), "TALLY".to_string()),
            2 | 3 => (format!("N#v{a}"), format!("A#v{b}")),
            _ => (format!("N#v{a}"), format!("L#v{b}")),
        };
        let key = (pk.clone(), sk.clone());
        if which < 2 {
            if self.items.contains_key(&key) {
                return;
            }
            let item: Attrs = [("PK", s(pk)), ("SK", s(sk)), ("title", s("t".into()))]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
            self.items.insert(key, item.clone());
            self.record(ChangeKind::Insert, None, Some(&item));
            return;
        }
        if bits & 0x80 != 0 {
            if let Some(old) = self.items.remove(&key) {
                self.record(ChangeKind::Remove, Some(&old), None);
            }
            return;
        }
        let mut item: Attrs = [
            ("PK", s(pk)),
            ("SK", s(sk)),
            (
                "x",
                s(["Sam", " kim ", "LEE"][usize::from(bits % 3)].to_string()),
            ),
            ("k", s(if bits & 4 != 0 { "p" } else { "q" }.to_string())),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        if bits & 8 != 0 {
            item.insert("f".into(), Av::Bool(bits & 16 != 0));
        }
        if bits & 32 != 0 {
            let n = if bits & 64 != 0 { "0.25" } else { "2" };
            item.insert("n".into(), Av::N(n.into()));
        }
        let old = self.items.insert(key, item.clone());
        let kind = if old.is_some() {
            ChangeKind::Modify
        } else {
            ChangeKind::Insert
        };
        self.record(kind, old.as_ref(), Some(&item));
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

fn client() -> &'static aws_sdk_dynamodb::Client {
    static CLIENT: OnceLock<aws_sdk_dynamodb::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        assert!(
            std::env::var_os("AWS_ENDPOINT_URL").is_some(),
            "the apply target needs DynamoDB Local: set AWS_ENDPOINT_URL (scripts/fuzz does)"
        );
        let config = runtime().block_on(
            aws_config::defaults(aws_config::BehaviorVersion::latest())
                .region(aws_config::Region::new("us-east-1"))
                .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
                    "local", "local", None, None, "fuzz",
                ))
                .load(),
        );
        aws_sdk_dynamodb::Client::new(&config)
    })
}

async fn scan(client: &aws_sdk_dynamodb::Client, table: &str) -> Vec<Attrs> {
    let mut items = Vec::new();
    let mut start = None;
    loop {
        let page = client
            .scan()
            .table_name(table)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .expect("scan");
        items.extend(page.items.unwrap_or_default());
        start = page.last_evaluated_key;
        if start.is_none() {
            return items;
        }
    }
}

async fn run(input: &[u8], client: &aws_sdk_dynamodb::Client) {
    let mut input = Bytes(input);
    let text = spec_text(&mut input);
    let Ok(spec) = Spec::from_toml(&text, "fuzzed.toml") else {
        return;
    };
    let mut history = History::default();
    let sizes = [input.below(8) + 1, input.below(8) + 1];
    let again = input.next();
    for _ in 0..40 {
        if input.is_empty() {
            break;
        }
        history.write(&mut input);
    }
    if history.records.is_empty() {
        return;
    }
    static TABLES: AtomicU64 = AtomicU64::new(0);
    let table = format!(
        "fz-{}-{}",
        std::process::id(),
        TABLES.fetch_add(1, Ordering::Relaxed)
    );
    let spec = Arc::new(spec);
    ddb_projector::table::create_table(client, &spec, &table)
        .await
        .expect("create the table");
    for item in history.items.values() {
        client
            .put_item()
            .table_name(&table)
            .set_item(Some(item.clone()))
            .send()
            .await
            .expect("put");
    }
    let applier = ddb_projector::control::applier(
        client.clone(),
        spec.clone(),
        &table,
        ApplyConfig::default(),
    );
    let records: Vec<_> = history.records.iter().cloned().map(Ok).collect();
    let mut at = 0;
    let mut turn = 0;
    while at < records.len() {
        let size = usize::from(sizes[turn % 2]);
        let batch = &records[at..(at + size).min(records.len())];
        // Delivered again from the first record not handled; now and then
        // the whole batch twice.
        for _ in 0..1 + usize::from(again >> (turn % 8) & 1) {
            let mut start = 0;
            for pass in 0.. {
                assert!(pass < 20, "a batch was not handled after 20 passes\n{text}");
                let outcome = applier
                    .apply_batch(&batch[start..], &BatchOptions::default())
                    .await
                    .unwrap_or_else(|error| panic!("the batch failed whole: {error}\n{text}"));
                match outcome.first_failure() {
                    Some(index) => start += index,
                    None => break,
                }
            }
        }
        at += batch.len();
        turn += 1;
    }
    let letters = applier.dead_letter_store().list().await.expect("letters");
    let items = scan(client, &table).await;
    let problems = oracle::differences(&text, &items);
    let _ = client.delete_table().table_name(&table).send().await;
    if std::env::var_os("APPLY_FUZZ_SHOW").is_some() {
        // What an input ran: `APPLY_FUZZ_SHOW=1 cargo fuzz run ... apply FILE`.
        eprintln!("{text}\n{} records; the table after:", records.len());
        for item in &items {
            eprintln!("  {item:?}");
        }
    }
    assert!(letters.is_empty(), "dead letters: {letters:?}\n{text}");
    assert!(
        problems.is_empty(),
        "the table differs from what the spec computes:\n  {}\n{text}",
        problems.join("\n  ")
    );
}

fuzz_target!(|input: &[u8]| {
    // Made outside the runtime: loading the configuration blocks on it.
    let client = client();
    runtime().block_on(run(input, client));
});
