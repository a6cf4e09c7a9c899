# A step that tries to download data: the sandbox has no network.
import urllib.request

data = urllib.request.urlopen("http://example.com/titanic.csv", timeout=5).read()
print(len(data))
