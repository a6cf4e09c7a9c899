# Step 2: `df` is still defined (same session); the summary table.
summary = (
    df.groupby(["Pclass", "Sex"])
    .agg(passengers=("PassengerId", "count"), survived=("Survived", "sum"), survival_rate=("Survived", "mean"), mean_age=("Age", "mean"))
    .round(3)
    .reset_index()
)
summary.to_csv("/workspace/output/summary.csv", index=False)
print(summary.to_string(index=False))
print("overall survival", round(df["Survived"].mean(), 3))
