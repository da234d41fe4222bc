//! Planning `index-keys`.

use super::IndexKeys;
use crate::effect::{Effect, Op, PlanProblem, Subject};
use crate::record::{AttributeValue, ChangeKind, ValueRef};
use crate::schema::ProjectionId;

/// Plans the derived attributes for an inserted or modified item.
///
/// Plans nothing when the item already carries the derived values: the
/// projector's own write comes back through the stream as a MODIFY, and
/// this is what stops it from looping.
pub(crate) fn plan(
    id: ProjectionId,
    projection: &IndexKeys,
    subject: &Subject<'_>,
    effects: &mut Vec<Effect>,
) -> Result<(), PlanProblem> {
    if subject.record.kind == ChangeKind::Remove {
        return Ok(());
    }
    let image = subject.new_image(subject.record.view_type)?;
    let mut values = Vec::with_capacity(projection.set.len());
    let mut differs = false;
    for (attr, template) in &projection.set {
        let value = template.render(&subject.vars, Some(image))?;
        differs |= !matches!(image.get(attr), Some(ValueRef::S(current)) if current == value);
        values.push(value);
    }
    if !differs {
        return Ok(());
    }
    let set = projection
        .set
        .iter()
        .zip(values)
        .map(|((attr, _), value)| (attr.clone(), AttributeValue::S(value)))
        .collect();
    let expect = projection
        .reads
        .iter()
        .filter_map(|name| {
            image
                .get(name)
                .map(|value| (name.clone(), value.to_value()))
        })
        .collect();
    effects.push(Effect {
        projection: id,
        op: Op::SetAttributes {
            key: subject.key.clone(),
            set,
            expect,
        },
    });
    Ok(())
}
