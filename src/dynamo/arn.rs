//! Reading Amazon Resource Names.

/// The table name in a stream ARN
/// (`arn:aws:dynamodb:REGION:ACCOUNT:table/NAME/stream/LABEL`).
pub fn table_from_stream_arn(arn: &str) -> Option<&str> {
    let resource = arn.splitn(6, ':').nth(5)?;
    let rest = resource.strip_prefix("table/")?;
    let (name, _) = rest.split_once("/stream/")?;
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_come_from_stream_arns() {
        assert_eq!(
            table_from_stream_arn(
                "arn:aws:dynamodb:us-east-1:123456789012:table/UserServiceTable/stream/2026-11-22T05:46:05.210"
            ),
            Some("UserServiceTable")
        );
        assert_eq!(
            table_from_stream_arn("arn:aws:dynamodb:ddblocal:000000000000:table/a-b.c_1/stream/2026-01-01T00:00:00.000"),
            Some("a-b.c_1")
        );
        assert_eq!(
            table_from_stream_arn("arn:aws:dynamodb:us-east-1:1:table/T"),
            None
        );
        assert_eq!(
            table_from_stream_arn("arn:aws:kinesis:us-east-1:1:stream/T"),
            None
        );
        assert_eq!(table_from_stream_arn("nonsense"), None);
    }
}
