//! `template.yaml` is where the table is defined; the store's constants
//! must agree with it, and every function crate must be deployed.

use serde_norway::Value;
use shared::store::{Index, PK, SK, TTL};

fn template() -> Value {
    let path = format!("{}/../template.yaml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn key_schema(v: &Value) -> Vec<(String, String)> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .map(|k| {
                    (
                        k["AttributeName"].as_str().unwrap_or("").to_owned(),
                        k["KeyType"].as_str().unwrap_or("").to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn pair(hash: &str, range: &str) -> Vec<(String, String)> {
    vec![(hash.into(), "HASH".into()), (range.into(), "RANGE".into())]
}

#[test]
fn the_table_in_template_yaml_matches_the_store() {
    let t = template();
    let table = &t["Resources"]["Table"];
    assert_eq!(table["Type"].as_str(), Some("AWS::DynamoDB::Table"));
    let props = &table["Properties"];
    assert_eq!(key_schema(&props["KeySchema"]), pair(PK, SK));
    let gsis = props["GlobalSecondaryIndexes"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    assert_eq!(gsis.len(), Index::ALL.len(), "one GSI per store::Index");
    for index in Index::ALL {
        let Some(gsi) = gsis
            .iter()
            .find(|g| g["IndexName"].as_str() == Some(index.name()))
        else {
            panic!("index {} missing from template.yaml", index.name())
        };
        assert_eq!(
            key_schema(&gsi["KeySchema"]),
            pair(index.pk_attr(), index.sk_attr())
        );
        assert_eq!(gsi["Projection"]["ProjectionType"].as_str(), Some("ALL"));
    }
    let attrs: Vec<&str> = props["AttributeDefinitions"]
        .as_sequence()
        .map(|s| {
            s.iter()
                .filter_map(|a| a["AttributeName"].as_str())
                .collect()
        })
        .unwrap_or_default();
    let mut expected = vec![PK, SK];
    for index in Index::ALL {
        expected.extend([index.pk_attr(), index.sk_attr()]);
    }
    assert_eq!(attrs, expected);
    assert_eq!(
        props["TimeToLiveSpecification"]["AttributeName"].as_str(),
        Some(TTL)
    );
    assert_eq!(
        props["TimeToLiveSpecification"]["Enabled"].as_bool(),
        Some(true)
    );
}

/// An index as (name, key schema, projection type).
type Gsi = (String, Vec<(String, String)>, String);

/// `dynamo::create_table` builds the table from `dynamo::table_schema()`;
/// that data must be exactly the table `template.yaml` deploys.
#[test]
fn the_dynamo_table_definition_matches_template_yaml() {
    let t = template();
    let props = &t["Resources"]["Table"]["Properties"];
    let schema = shared::store::dynamo::table_schema();
    let owned = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    };
    assert_eq!(props["BillingMode"].as_str(), Some(schema.billing_mode));
    let attrs: Vec<(String, String)> = props["AttributeDefinitions"]
        .as_sequence()
        .map(|s| {
            s.iter()
                .map(|a| {
                    (
                        a["AttributeName"].as_str().unwrap_or("").to_owned(),
                        a["AttributeType"].as_str().unwrap_or("").to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(attrs, owned(&schema.attributes), "AttributeDefinitions");
    assert_eq!(
        key_schema(&props["KeySchema"]),
        owned(&schema.key_schema),
        "KeySchema"
    );
    let gsis: Vec<Gsi> = props["GlobalSecondaryIndexes"]
        .as_sequence()
        .map(|s| {
            s.iter()
                .map(|g| {
                    (
                        g["IndexName"].as_str().unwrap_or("").to_owned(),
                        key_schema(&g["KeySchema"]),
                        g["Projection"]["ProjectionType"]
                            .as_str()
                            .unwrap_or("")
                            .to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let expected: Vec<Gsi> = schema
        .indexes
        .iter()
        .map(|i| {
            (
                i.name.to_owned(),
                owned(&i.key_schema),
                i.projection.to_owned(),
            )
        })
        .collect();
    assert_eq!(gsis, expected, "GlobalSecondaryIndexes");
    let ttl = &props["TimeToLiveSpecification"];
    assert_eq!(ttl["AttributeName"].as_str(), Some(schema.ttl_attribute));
    assert_eq!(ttl["Enabled"].as_bool(), Some(true));
    assert_eq!(
        props["StreamSpecification"]["StreamViewType"].as_str(),
        Some(schema.stream_view_type)
    );
}

#[test]
fn every_function_crate_is_a_cargo_lambda_function_in_template_yaml() {
    let t = template();
    let resources = t["Resources"].as_mapping().cloned().unwrap_or_default();
    let binaries: Vec<String> = resources
        .values()
        .filter(|r| r["Type"].as_str() == Some("AWS::Serverless::Function"))
        .map(|r| {
            assert_eq!(
                r["Metadata"]["BuildMethod"].as_str(),
                Some("rust-cargolambda")
            );
            r["Metadata"]["BuildProperties"]["Binary"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    let dir = format!("{}/../functions", env!("CARGO_MANIFEST_DIR"));
    let mut crates: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    crates.sort();
    assert!(!crates.is_empty());
    for name in crates {
        assert!(
            binaries.contains(&name),
            "functions/{name} is not declared in template.yaml"
        );
    }
    let globals = &t["Globals"]["Function"];
    assert_eq!(globals["Runtime"].as_str(), Some("provided.al2023"));
    assert_eq!(globals["Architectures"][0].as_str(), Some("arm64"));
}
