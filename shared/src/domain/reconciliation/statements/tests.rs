//! The statement parsers: each provider and format, every bad input, and
//! a fuzz over arbitrary and mutated files (never a panic).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

fn paisa(v: i64) -> Paisa {
    Paisa::new(v).unwrap_or_default()
}

fn ts(s: &str) -> Timestamp {
    Timestamp::parse(s).unwrap_or_else(|| panic!("bad test time {s}"))
}

const ESEWA_CSV: &str = "\
eSewa Merchant Statement
Merchant Code: EPAYTEST,,,,,,
From 2026-11-28 To 2026-11-28
,,,,,,
S.N.,Transaction Date,Transaction UUID,Reference Id,Amount,Service Charge,Status,Type
1,2026-11-28 14:00:00,01JD5Z3K7QWXYZ000001,0007ABC,\"1,500.50\",15.00,Success,Payment
2,2026-11-28 15:30:00,01JD5Z3K7QWXYZ000002,0007ABD,100,,Failed,Payment
3,2026-11-28 16:00:00,01JD5Z3K7QWXYZ000001,0007ABE,500.00,,Success,Refund
,,,Total,\"2,100.50\",15.00,,
";

fn esewa_line_1() -> StatementLine {
    StatementLine {
        line: 6,
        provider: Provider::Esewa,
        reference: Some("01JD5Z3K7QWXYZ000001".into()),
        provider_ref: Some("0007ABC".into()),
        kind: LineKind::Payment,
        status: LineStatus::Success,
        amount: paisa(150_050),
        fee: Some(paisa(1500)),
        at: ts("2026-11-28T08:15:00Z"),
    }
}

#[test]
fn an_esewa_csv_with_title_rows_is_read_whole() {
    let s = parse(Provider::Esewa, ESEWA_CSV.as_bytes()).expect("parses");
    assert_eq!(s.provider, Provider::Esewa);
    assert_eq!(s.account.as_deref(), Some("EPAYTEST"));
    assert_eq!(s.lines.len(), 3, "the totals row is not a line");
    assert_eq!(s.lines[0], esewa_line_1());
    assert_eq!(s.lines[1].status, LineStatus::Failed);
    assert_eq!(s.lines[1].amount, paisa(10_000));
    assert_eq!(s.lines[1].fee, None);
    assert_eq!(s.lines[1].line, 7);
    assert_eq!(s.lines[2].kind, LineKind::Refund);
    assert_eq!(s.lines[2].amount, paisa(50_000));
    assert_eq!(s.digest, digest(ESEWA_CSV.as_bytes()));
    assert_eq!(s.digest.len(), 64);
    // The same bytes, the same digest; another byte, another.
    let again = parse(Provider::Esewa, ESEWA_CSV.as_bytes()).expect("parses");
    assert_eq!(again, s);
    let other = format!("{ESEWA_CSV}\n");
    assert_ne!(
        parse(Provider::Esewa, other.as_bytes())
            .expect("parses")
            .digest,
        s.digest
    );
}

#[test]
fn a_fonepay_csv_may_use_semicolons_a_bom_and_other_spellings() {
    let csv = "\u{feff}PRN;Trace No;Txn Amount;Commission Amount;Txn Date;Payment Status\r\n\
               PRN-1;900001;10.00;0.15;2026-11-28T14:00:00+05:45;SUCCESS\r\n\
               PRN-2;900002;20;;2026/11/28 23:59;pending\r\n";
    let s = parse(Provider::Fonepay, csv.as_bytes()).expect("parses");
    assert_eq!(s.account, None);
    assert_eq!(s.lines.len(), 2);
    let l = &s.lines[0];
    assert_eq!(l.line, 2);
    assert_eq!(l.provider, Provider::Fonepay);
    assert_eq!(l.reference.as_deref(), Some("PRN-1"));
    assert_eq!(l.provider_ref.as_deref(), Some("900001"));
    assert_eq!((l.amount, l.fee), (paisa(1000), Some(paisa(15))));
    assert_eq!(l.at, ts("2026-11-28T08:15:00Z"));
    assert_eq!(l.kind, LineKind::Payment);
    assert_eq!(s.lines[1].status, LineStatus::Pending);
    assert_eq!(s.lines[1].at, ts("2026-11-28T18:14:00Z"));
}

fn utf16(text: &str, le: bool) -> Vec<u8> {
    let mut out = if le {
        vec![0xFF, 0xFE]
    } else {
        vec![0xFE, 0xFF]
    };
    for u in text.encode_utf16() {
        out.extend(if le { u.to_le_bytes() } else { u.to_be_bytes() });
    }
    out
}

#[test]
fn utf16_exports_with_a_byte_order_mark_are_read() {
    let tabbed = ESEWA_CSV
        .replace(',', "\t")
        .replace("\"1\t500.50\"", "1500.50");
    for le in [true, false] {
        let s = parse(Provider::Esewa, &utf16(&tabbed, le)).expect("parses");
        assert_eq!(s.lines.len(), 3);
        assert_eq!(s.lines[0], esewa_line_1());
        assert_eq!(s.account.as_deref(), Some("EPAYTEST"));
    }
    // An unpaired surrogate is refused, naming its line.
    let mut bad = utf16("PRN,Amount\nx,", true);
    bad.extend([0x00, 0xD8, 0x41, 0x00]);
    let e = parse(Provider::Fonepay, &bad).expect_err("refused");
    assert_eq!(e.line, Some(2));
    assert!(e.message.contains("UTF-16"), "{e}");
}

fn xlsx(rows: &[Vec<XCell>]) -> Vec<u8> {
    use rust_xlsxwriter::{ExcelDateTime, Format as XFormat, Workbook};
    let mut book = Workbook::new();
    let sheet = book.add_worksheet();
    let date = XFormat::new().set_num_format("yyyy-mm-dd hh:mm:ss");
    for (r, row) in rows.iter().enumerate() {
        let r = u32::try_from(r).expect("few rows");
        for (c, cell) in row.iter().enumerate() {
            let c = u16::try_from(c).expect("few columns");
            match cell {
                XCell::S(s) => sheet.write_string(r, c, *s).map(|_| ()),
                XCell::N(n) => sheet.write_number(r, c, *n).map(|_| ()),
                XCell::D(d) => {
                    let d = ExcelDateTime::parse_from_str(d).expect("test date");
                    sheet
                        .write_datetime_with_format(r, c, &d, &date)
                        .map(|_| ())
                }
                XCell::E => Ok(()),
            }
            .expect("writes");
        }
    }
    book.save_to_buffer().expect("saves")
}

enum XCell {
    S(&'static str),
    N(f64),
    D(&'static str),
    E,
}
use XCell::{D, E, N, S};

#[test]
fn an_esewa_xlsx_with_numbers_and_date_cells_is_read() {
    let bytes = xlsx(&[
        vec![S("eSewa Merchant Statement")],
        vec![S("Merchant Code"), S("EPAYTEST")],
        vec![],
        vec![
            S("Transaction Date"),
            S("Product ID"),
            S("Ref ID"),
            S("Amount"),
            S("Commission"),
            S("Status"),
        ],
        vec![
            D("2026-11-28 14:00:00"),
            S("01JD5Z3K7QWXYZ000001"),
            S("0007ABC"),
            N(1500.5),
            N(15.0),
            S("COMPLETE"),
        ],
        vec![
            S("2026-11-28 15:30:00"),
            S("01JD5Z3K7QWXYZ000002"),
            N(123456.0),
            S("1,000.00"),
            E,
            S("Refunded"),
        ],
        vec![E, E, E, S("Total")],
    ]);
    assert_eq!(Format::sniff(&bytes), Format::Xlsx);
    let s = parse(Provider::Esewa, &bytes).expect("parses");
    assert_eq!(s.account.as_deref(), Some("EPAYTEST"));
    assert_eq!(s.lines.len(), 2);
    let mut want = esewa_line_1();
    want.line = 5;
    assert_eq!(s.lines[0], want);
    let l = &s.lines[1];
    assert_eq!(l.line, 6);
    assert_eq!(l.provider_ref.as_deref(), Some("123456"));
    assert_eq!(l.amount, paisa(100_000));
    assert_eq!(l.status, LineStatus::Refunded);
    assert_eq!(l.at, ts("2026-11-28T09:45:00Z"));
}

#[test]
fn an_xlsx_amount_that_is_no_whole_paisa_is_refused_naming_the_cell() {
    let bytes = xlsx(&[
        vec![S("PRN"), S("Amount"), S("Date")],
        vec![S("A"), N(10.0), S("2026-11-28")],
        vec![S("B"), N(10.005), S("2026-11-28")],
    ]);
    let e = parse(Provider::Fonepay, &bytes).expect_err("refused");
    assert_eq!((e.line, e.column.as_deref()), (Some(3), Some("Amount")));
    assert_eq!(
        e.to_string(),
        "line 3, column 'Amount': the amount is not a whole number of paisa"
    );
}

#[test]
fn a_fonepay_xls_is_read() {
    // Written by Python's xlwt (BIFF8): a title row, the merchant code
    // in two cells, a date cell and a text date, a numeric trace id.
    let bytes = include_bytes!("fixtures/fonepay.xls");
    assert_eq!(Format::sniff(bytes), Format::Xls);
    let s = parse(Provider::Fonepay, bytes).expect("parses");
    assert_eq!(s.account.as_deref(), Some("FPMERCHANT01"));
    assert_eq!(s.lines.len(), 2);
    let l = &s.lines[0];
    assert_eq!(l.line, 5);
    assert_eq!(l.reference.as_deref(), Some("01JD5Z3K7QWXYZ000001"));
    assert_eq!(l.provider_ref.as_deref(), Some("T1001"));
    assert_eq!((l.amount, l.fee), (paisa(150_050), Some(paisa(2251))));
    assert_eq!(l.at, ts("2026-11-28T08:15:00Z"));
    let l = &s.lines[1];
    assert_eq!(l.provider_ref.as_deref(), Some("98765"));
    assert_eq!(
        (l.amount, l.fee, l.status),
        (paisa(200_000), None, LineStatus::Failed)
    );
}

fn refused(provider: Provider, bytes: &[u8]) -> ParseError {
    match parse(provider, bytes) {
        Ok(s) => panic!("accepted: {s:?}"),
        Err(e) => e,
    }
}

#[test]
fn bad_files_are_refused_naming_the_line_and_column() {
    let header = "Transaction Date,Transaction UUID,Reference Id,Amount,Status\n";
    let with = |rows: &str| format!("{header}{rows}");
    let cases: Vec<(String, Option<u32>, Option<&str>, &str)> = vec![
        (String::new(), None, None, "empty"),
        (" \n\n".into(), None, None, "empty"),
        (",,,\n,,\n".into(), None, None, "empty"),
        ("a,b,c\n1,2,3\n".into(), None, None, "unknown columns"),
        (
            "Reference Id,Status\nX,Success\n".into(),
            Some(1),
            None,
            "amount",
        ),
        (
            "Amount,Date\n1,2026-11-28\n".into(),
            Some(1),
            None,
            "reference",
        ),
        (
            with("2026-11-28 10:00,U1,R1,-100,Success\n"),
            Some(2),
            Some("Amount"),
            "negative",
        ),
        (
            with("2026-11-28 10:00,U1,R1,ten,Success\n"),
            Some(2),
            Some("Amount"),
            "not an amount",
        ),
        (
            with("2026-11-28 10:00,U1,R1,,Success\n"),
            Some(2),
            Some("Amount"),
            "empty",
        ),
        (
            with("2026-11-28 10:00,U1,R1,1e3,Success\n"),
            Some(2),
            Some("Amount"),
            "not an amount",
        ),
        (
            with("yesterday,U1,R1,10,Success\n"),
            Some(2),
            Some("Transaction Date"),
            "not a date",
        ),
        (
            with("2026-11-28 10:00,U1,R1,10,\n"),
            Some(2),
            Some("Status"),
            "status is empty",
        ),
        (
            with("2026-11-28 10:00,,,10,Success\n"),
            Some(2),
            Some("Reference Id"),
            "no reference",
        ),
        (
            with("2026-11-28 10:00,U1,R1,10,Success\n2026-11-28 11:00,U2,R1,10,Success\n"),
            Some(3),
            Some("Reference Id"),
            "duplicate line: 'R1' is already on line 2",
        ),
        (
            "Amount,Total Amount,Date,PID\n".into(),
            Some(1),
            Some("Total Amount"),
            "both mean",
        ),
        (
            "Date,PID,Amount,Type\n2026-11-28,A,1,Chargeback\n".into(),
            Some(2),
            Some("Type"),
            "not a payment or a refund",
        ),
    ];
    for (text, line, column, words) in cases {
        let e = refused(Provider::Esewa, text.as_bytes());
        assert_eq!(
            (e.line, e.column.as_deref()),
            (line, column),
            "{text:?}: {e}"
        );
        assert!(e.message.contains(words), "{text:?}: {e}");
    }
}

#[test]
fn a_payment_and_its_refund_may_share_a_reference() {
    let csv = "Date,PID,Amount,Type\n2026-11-28,A,10,Payment\n2026-11-28,A,10,Refund\n";
    let s = parse(Provider::Esewa, csv.as_bytes()).expect("parses");
    assert_eq!(s.lines.len(), 2);
}

#[test]
fn another_encoding_is_refused_naming_the_line() {
    // Latin-1 "é" on line 3.
    let mut bytes = b"PID,Amount,Date\nA,1,2026-11-28\nB\xe9,1,2026-11-28\n".to_vec();
    let e = refused(Provider::Esewa, &bytes);
    assert_eq!(e.line, Some(3));
    assert!(e.message.contains("not UTF-8"), "{e}");
    bytes.clear();
}

#[test]
fn a_file_over_the_limits_is_refused() {
    let big = vec![b'a'; MAX_BYTES + 1];
    let e = refused(Provider::Esewa, &big);
    assert!(e.message.contains("larger than 10 MB"), "{e}");

    let mut text = String::from("PID,Amount,Date\n");
    for i in 0..MAX_LINES {
        text.push_str(&format!("P{i},1,2026-11-28\n"));
    }
    let e = refused(Provider::Esewa, text.as_bytes());
    assert_eq!(e.line, Some(u32::try_from(MAX_LINES + 1).unwrap_or(0)));
    assert!(e.message.contains("more than 50000 lines"), "{e}");
    // One line fewer is a whole statement.
    let at = text.trim_end().rfind('\n').unwrap_or(0);
    let s = parse(Provider::Esewa, &text.as_bytes()[..=at]).expect("parses");
    assert_eq!(s.lines.len(), MAX_LINES - 1);
}

#[test]
fn a_broken_spreadsheet_is_refused() {
    let good = xlsx(&[
        vec![S("PRN"), S("Amount"), S("Date")],
        vec![S("A"), N(1.0), S("2026-11-28")],
    ]);
    let truncated = &good[..good.len() / 2];
    let e = refused(Provider::Fonepay, truncated);
    assert!(e.message.contains("XLSX file is broken"), "{e}");
    let e = refused(Provider::Fonepay, b"PK\x03\x04 not a zip at all");
    assert!(e.message.contains("XLSX file is broken"), "{e}");
    let mut xls = vec![0xD0, 0xCF, 0x11, 0xE0, 0xA1, 0xB1, 0x1A, 0xE1];
    xls.extend([0u8; 600]);
    let e = refused(Provider::Fonepay, &xls);
    assert!(e.message.contains("XLS file is broken"), "{e}");
}

#[test]
fn a_sheet_past_the_line_limit_is_refused_without_reading_its_extent() {
    use rust_xlsxwriter::Workbook;
    let mut book = Workbook::new();
    let sheet = book.add_worksheet();
    let row = u32::try_from(MAX_LINES).unwrap_or(0);
    for (c, h) in ["PRN", "Amount", "Date"].iter().enumerate() {
        sheet
            .write_string(0, u16::try_from(c).unwrap_or(0), *h)
            .expect("writes");
    }
    sheet.write_string(row, 0, "far away").expect("writes");
    sheet
        .write_string(1_048_575, 16_383, "the corner")
        .expect("writes");
    let bytes = book.save_to_buffer().expect("saves");
    let e = refused(Provider::Fonepay, &bytes);
    assert_eq!(e.line, Some(row + 1));
}

#[test]
fn khalti_statements_are_not_files() {
    let e = refused(Provider::Khalti, ESEWA_CSV.as_bytes());
    assert!(e.message.contains("pulled"), "{e}");
}

#[test]
fn the_format_is_sniffed_from_the_bytes() {
    assert_eq!(Format::sniff(b"PK\x03\x04rest"), Format::Xlsx);
    assert_eq!(
        Format::sniff(&[0xD0, 0xCF, 0x11, 0xE0, 0xA1, 0xB1, 0x1A, 0xE1, 0]),
        Format::Xls
    );
    assert_eq!(Format::sniff(b"PRN,Amount"), Format::Csv);
    assert_eq!(Format::sniff(b""), Format::Csv);
}

/// Fuzz cases per run: `STATEMENT_FUZZ_CASES` (e.g. 20000 locally).
fn fuzz_cases() -> usize {
    std::env::var("STATEMENT_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

fn mutate(rng: &mut StdRng, base: &[u8]) -> Vec<u8> {
    let mut out = base.to_vec();
    for _ in 0..rng.random_range(1..8) {
        if out.is_empty() {
            out.push(rng.random());
            continue;
        }
        let at = rng.random_range(0..out.len());
        match rng.random_range(0..5) {
            0 => out[at] = rng.random(),
            1 => {
                out.remove(at);
            }
            2 => out.insert(at, rng.random()),
            3 => out.truncate(at),
            _ => {
                let b = *b",;\n\"-.0123456789eE\t\r"
                    .get(rng.random_range(0..20))
                    .unwrap_or(&b'x');
                out.insert(at, b);
            }
        }
    }
    out
}

#[test]
fn the_parsers_never_panic_on_arbitrary_or_mutated_files() {
    let seed: u64 = std::env::var("STATEMENT_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(41);
    let mut rng = StdRng::seed_from_u64(seed);
    let xlsx_base = xlsx(&[
        vec![S("Merchant Code: X")],
        vec![
            S("PRN"),
            S("Trace Id"),
            S("Amount"),
            S("Commission"),
            S("Date"),
            S("Status"),
        ],
        vec![
            S("A"),
            S("T1"),
            N(10.5),
            N(0.15),
            D("2026-11-28 10:00:00"),
            S("Success"),
        ],
        vec![
            S("B"),
            S("T2"),
            S("1,000"),
            E,
            S("2026-11-28 11:00"),
            S("Failed"),
        ],
    ]);
    let xls_base: &[u8] = include_bytes!("fixtures/fonepay.xls");
    let csv_base = ESEWA_CSV.as_bytes();
    let prefixes: [&[u8]; 5] = [
        b"",
        b"PK\x03\x04",
        &[0xD0, 0xCF, 0x11, 0xE0, 0xA1, 0xB1, 0x1A, 0xE1],
        &[0xFF, 0xFE],
        &[0xEF, 0xBB, 0xBF],
    ];
    let mut accepted = 0usize;
    for case in 0..fuzz_cases() {
        let bytes = match case % 5 {
            0 => {
                let mut b = prefixes[rng.random_range(0..prefixes.len())].to_vec();
                let n = rng.random_range(0..512);
                b.extend((0..n).map(|_| rng.random::<u8>()));
                b
            }
            1 => mutate(&mut rng, csv_base),
            2 => mutate(&mut rng, &xlsx_base),
            3 => mutate(&mut rng, xls_base),
            _ => {
                let lines: Vec<&str> = ESEWA_CSV.lines().collect();
                let mut text = String::new();
                for _ in 0..rng.random_range(0..12) {
                    text.push_str(lines[rng.random_range(0..lines.len())]);
                    text.push('\n');
                }
                text.into_bytes()
            }
        };
        for provider in Provider::ALL {
            // Whatever the answer, it is an answer: a statement whose
            // lines are all well formed, or an error.
            if let Ok(s) = parse(provider, &bytes) {
                accepted += 1;
                assert_eq!(s.digest, digest(&bytes));
                for l in &s.lines {
                    assert!(l.line >= 1);
                    assert!(l.reference.is_some() || l.provider_ref.is_some());
                }
            }
        }
    }
    // Some mutations keep a file readable: the fuzz reaches past the
    // first checks.
    assert!(fuzz_cases() < 100 || accepted > 0);
}
