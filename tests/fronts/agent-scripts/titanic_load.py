# Titanic EDA, step 1 (a session cell): load once, look, and make a mistake
# the model then fixes (the column is `Survived`, not `survived`).
import pandas as pd

df = pd.read_csv("/workspace/input/titanic.csv")
print(df.shape)
print(df.dtypes.to_string())
print(df.isna().sum().to_string())
print(df.groupby("Pclass")["survived"].mean())
