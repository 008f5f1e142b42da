//! Evaluation of [`Cond`] on one item: the reference semantics every backend
//! follows (the embedded store runs it; a DynamoDB backend translates to
//! condition expressions that agree with it).
//!
//! - `Exists`/`NotExists` look at the item itself.
//! - `AttrExists` holds for a present attribute, even one holding `null`.
//! - `Cmp` on a missing attribute (or a missing item) is false, except
//!   `Ne`, which is true there, as in DynamoDB (`a <> :v` holds when `a` is
//!   absent).
//! - `Eq`/`Ne` compare whole JSON values. Numbers, also inside arrays and
//!   objects, compare numerically, so `1 == 1.0` (DynamoDB stores numbers as
//!   decimals and treats `1` and `1.0` as one number). A type mismatch is
//!   "not equal".
//! - `Lt`/`Le`/`Gt`/`Ge` order numbers numerically and strings by their UTF-8
//!   bytes; any other pairing (a type mismatch, booleans, null, arrays,
//!   objects) is false.
//! - `And([])` is true, `Or([])` is false.

use std::cmp::Ordering;

use serde_json::{Number, Value};

use super::{CmpOp, Cond, Item, StoreError};

/// Whether `cond` holds on `item` (`None`: no item at the key).
pub fn eval(cond: &Cond, item: Option<&Item>) -> bool {
    match cond {
        Cond::Exists => item.is_some(),
        Cond::NotExists => item.is_none(),
        Cond::AttrExists(attr) => item.is_some_and(|i| i.contains_key(attr)),
        Cond::AttrNotExists(attr) => !item.is_some_and(|i| i.contains_key(attr)),
        Cond::Cmp(attr, op, value) => match item.and_then(|i| i.get(attr)) {
            Some(actual) => compare(actual, *op, value),
            None => *op == CmpOp::Ne,
        },
        Cond::And(conds) => conds.iter().all(|c| eval(c, item)),
        Cond::Or(conds) => conds.iter().any(|c| eval(c, item)),
        Cond::Not(inner) => !eval(inner, item),
    }
}

/// `left op right` for two present values.
pub fn compare(left: &Value, op: CmpOp, right: &Value) -> bool {
    match op {
        CmpOp::Eq => values_equal(left, right),
        CmpOp::Ne => !values_equal(left, right),
        CmpOp::Lt | CmpOp::Le | CmpOp::Gt | CmpOp::Ge => match order(left, right) {
            Some(ord) => match op {
                CmpOp::Lt => ord == Ordering::Less,
                CmpOp::Le => ord != Ordering::Greater,
                CmpOp::Gt => ord == Ordering::Greater,
                _ => ord != Ordering::Less,
            },
            None => false,
        },
    }
}

/// Rejects conditions DynamoDB refuses as malformed requests (rather than
/// evaluating them to false): an empty attribute name, or an ordering
/// comparison against a constant that is neither a number nor a string
/// (DynamoDB: "Incorrect operand type for operator or function").
pub fn validate(cond: &Cond) -> Result<(), StoreError> {
    match cond {
        Cond::Exists | Cond::NotExists => Ok(()),
        Cond::AttrExists(attr) | Cond::AttrNotExists(attr) => check_attr_name(attr),
        Cond::Cmp(attr, op, value) => {
            check_attr_name(attr)?;
            let orders = matches!(op, CmpOp::Lt | CmpOp::Le | CmpOp::Gt | CmpOp::Ge);
            if orders && !matches!(value, Value::Number(_) | Value::String(_)) {
                return Err(StoreError::Invalid(format!(
                    "condition {attr} {op:?} needs a number or a string, got {value}"
                )));
            }
            Ok(())
        }
        Cond::And(conds) | Cond::Or(conds) => conds.iter().try_for_each(validate),
        Cond::Not(inner) => validate(inner),
    }
}

fn check_attr_name(attr: &str) -> Result<(), StoreError> {
    if attr.is_empty() {
        return Err(StoreError::Invalid(
            "condition on an empty attribute name".into(),
        ));
    }
    Ok(())
}

/// Whole-value equality with numbers compared numerically.
pub fn values_equal(left: &Value, right: &Value) -> bool {
    match (left, right) {
        (Value::Number(a), Value::Number(b)) => cmp_numbers(a, b) == Some(Ordering::Equal),
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| values_equal(x, y))
        }
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter()
                    .all(|(k, v)| b.get(k).is_some_and(|w| values_equal(v, w)))
        }
        _ => left == right,
    }
}

/// Order of two numbers or two strings; `None` for anything else.
fn order(left: &Value, right: &Value) -> Option<Ordering> {
    match (left, right) {
        (Value::Number(a), Value::Number(b)) => cmp_numbers(a, b),
        (Value::String(a), Value::String(b)) => Some(a.as_bytes().cmp(b.as_bytes())),
        _ => None,
    }
}

/// Exact for integers (i64 and u64 alike), `f64` order otherwise.
pub fn cmp_numbers(a: &Number, b: &Number) -> Option<Ordering> {
    match (as_i128(a), as_i128(b)) {
        (Some(x), Some(y)) => Some(x.cmp(&y)),
        _ => a.as_f64()?.partial_cmp(&b.as_f64()?),
    }
}

fn as_i128(n: &Number) -> Option<i128> {
    n.as_i64()
        .map(i128::from)
        .or_else(|| n.as_u64().map(i128::from))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn item(v: Value) -> Item {
        match v {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    fn sample() -> Item {
        item(json!({
            "pk": "p", "sk": "s",
            "n": 10, "neg": -3, "f": 2.5, "big": u64::MAX,
            "s": "m", "b": true, "nul": null,
            "obj": {"x": 1, "y": [1, 2]}, "arr": [1, "a"],
        }))
    }

    fn holds(cond: Cond) -> bool {
        eval(&cond, Some(&sample()))
    }

    #[test]
    fn existence() {
        let it = sample();
        assert!(eval(&Cond::Exists, Some(&it)));
        assert!(!eval(&Cond::Exists, None));
        assert!(eval(&Cond::NotExists, None));
        assert!(!eval(&Cond::NotExists, Some(&it)));
        assert!(eval(&Cond::AttrExists("n".into()), Some(&it)));
        assert!(eval(&Cond::AttrExists("nul".into()), Some(&it)));
        assert!(!eval(&Cond::AttrExists("zz".into()), Some(&it)));
        assert!(!eval(&Cond::AttrExists("n".into()), None));
        assert!(eval(&Cond::AttrNotExists("zz".into()), Some(&it)));
        assert!(eval(&Cond::AttrNotExists("n".into()), None));
        assert!(!eval(&Cond::AttrNotExists("n".into()), Some(&it)));
    }

    #[test]
    fn missing_attribute_or_item_is_false_for_every_operator_but_ne() {
        let c = Cond::ne("zz", 1);
        assert!(holds(c.clone()), "Ne on a missing attribute holds");
        assert!(eval(&c, None), "Ne on a missing item holds");
        for op in [CmpOp::Eq, CmpOp::Lt, CmpOp::Le, CmpOp::Gt, CmpOp::Ge] {
            let c = Cond::Cmp("zz".into(), op, json!(1));
            assert!(!holds(c.clone()), "{op:?} on a missing attribute");
            assert!(!eval(&c, None), "{op:?} on a missing item");
            assert!(holds(Cond::Not(Box::new(c))));
        }
    }

    #[test]
    fn equality() {
        assert!(holds(Cond::eq("n", 10)));
        assert!(holds(Cond::eq("n", 10.0)), "1 == 1.0 numerically");
        assert!(!holds(Cond::eq("n", 11)));
        assert!(holds(Cond::eq("big", u64::MAX)));
        assert!(!holds(Cond::eq("big", i64::MAX)));
        assert!(holds(Cond::eq("s", "m")));
        assert!(!holds(Cond::eq("s", 10)));
        assert!(!holds(Cond::eq("n", "10")));
        assert!(holds(Cond::eq("b", true)));
        assert!(holds(Cond::eq("nul", Value::Null)));
        assert!(holds(Cond::eq("obj", json!({"y": [1.0, 2], "x": 1}))));
        assert!(!holds(Cond::eq("obj", json!({"x": 1}))));
        assert!(!holds(Cond::eq(
            "obj",
            json!({"x": 1, "y": [1, 2], "z": 0})
        )));
        assert!(holds(Cond::eq("arr", json!([1, "a"]))));
        assert!(!holds(Cond::eq("arr", json!(["a", 1]))));
        assert!(holds(Cond::ne("n", 11)));
        assert!(!holds(Cond::ne("n", 10)));
        assert!(holds(Cond::ne("s", 10)), "type mismatch is not equal");
        assert!(holds(Cond::ne("obj", json!({}))));
    }

    #[test]
    fn ordering_numbers() {
        assert!(holds(Cond::lt("n", 11)));
        assert!(!holds(Cond::lt("n", 10)));
        assert!(holds(Cond::le("n", 10)));
        assert!(!holds(Cond::le("n", 9)));
        assert!(holds(Cond::gt("n", 9)));
        assert!(!holds(Cond::gt("n", 10)));
        assert!(holds(Cond::ge("n", 10)));
        assert!(!holds(Cond::ge("n", 10.5)));
        assert!(holds(Cond::lt("n", 10.5)));
        assert!(holds(Cond::gt("f", 2)));
        assert!(holds(Cond::lt("f", 3)));
        assert!(!holds(Cond::lt("f", 2.5)));
        assert!(holds(Cond::le("f", 2.5)));
        assert!(holds(Cond::lt("neg", 0)));
        assert!(holds(Cond::gt("neg", -3.5)));
        assert!(holds(Cond::gt("big", i64::MAX)));
        assert!(holds(Cond::gt("n", -1)));
    }

    #[test]
    fn ordering_strings_is_bytewise() {
        assert!(holds(Cond::lt("s", "n")));
        assert!(holds(Cond::gt("s", "l")));
        assert!(holds(Cond::ge("s", "m")));
        assert!(
            holds(Cond::gt("s", "M")),
            "lower case sorts after upper case"
        );
        assert!(holds(Cond::lt("s", "ma")));
        let it = item(json!({"a": "z", "c": "\u{FFFD}"}));
        // UTF-8 byte order, not UTF-16 code-unit order.
        assert!(eval(&Cond::lt("a", "é"), Some(&it)));
        assert!(eval(&Cond::lt("c", "😀"), Some(&it)));
    }

    #[test]
    fn ordering_type_mismatch_is_false() {
        for op in [CmpOp::Lt, CmpOp::Le, CmpOp::Gt, CmpOp::Ge] {
            assert!(!holds(Cond::Cmp("n".into(), op, json!("z"))), "{op:?}");
            assert!(!holds(Cond::Cmp("s".into(), op, json!(100))), "{op:?}");
            assert!(!holds(Cond::Cmp("b".into(), op, json!(1))), "{op:?}");
            assert!(!holds(Cond::Cmp("obj".into(), op, json!(1))), "{op:?}");
            assert!(!holds(Cond::Cmp("nul".into(), op, json!("a"))), "{op:?}");
        }
    }

    #[test]
    fn logic() {
        let t = Cond::eq("n", 10);
        let f = Cond::eq("n", 11);
        assert!(holds(Cond::And(vec![t.clone(), t.clone()])));
        assert!(!holds(Cond::And(vec![t.clone(), f.clone()])));
        assert!(holds(Cond::Or(vec![f.clone(), t.clone()])));
        assert!(!holds(Cond::Or(vec![f.clone(), f.clone()])));
        assert!(holds(Cond::Not(Box::new(f.clone()))));
        assert!(!holds(Cond::Not(Box::new(t.clone()))));
        assert!(holds(Cond::And(vec![])));
        assert!(!holds(Cond::Or(vec![])));
        let nested = Cond::And(vec![
            Cond::Exists,
            Cond::Or(vec![f, Cond::Not(Box::new(Cond::AttrExists("zz".into())))]),
        ]);
        assert!(holds(nested.clone()));
        assert!(!eval(&nested, None));
    }

    #[test]
    fn validation() {
        assert!(validate(&Cond::lt("n", 1)).is_ok());
        assert!(validate(&Cond::ge("s", "a")).is_ok());
        assert!(validate(&Cond::eq("b", true)).is_ok());
        assert!(validate(&Cond::eq("o", json!({"a": 1}))).is_ok());
        assert!(matches!(
            validate(&Cond::lt("b", true)),
            Err(StoreError::Invalid(_))
        ));
        assert!(matches!(
            validate(&Cond::Not(Box::new(Cond::Or(vec![Cond::gt(
                "x",
                Value::Null
            )])))),
            Err(StoreError::Invalid(_))
        ));
        assert!(matches!(
            validate(&Cond::AttrExists(String::new())),
            Err(StoreError::Invalid(_))
        ));
    }
}
