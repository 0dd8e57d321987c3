"""What a report says and how it looks: the activity summary, its wording and numbers, the templates."""
