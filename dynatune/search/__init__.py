"""The search of one task: the incremental tuning session over MetaSchedule, its builder, the measurement
(fixed or adaptive), the cost models, the database of measured records, and what follows each batch."""
