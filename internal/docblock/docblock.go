package docblock

import (
	"bytes"
	"fmt"
	"os"
)

// Replace replaces what lies between <!-- name --> and <!-- /name --> in
// the file at path with body; a file without the block is an error and is
// left as it was.
func Replace(path, name, body string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	begin, end := "<!-- "+name+" -->\n", "<!-- /"+name+" -->"
	i := bytes.Index(b, []byte(begin))
	j := bytes.Index(b, []byte(end))
	if i < 0 || j < i {
		return fmt.Errorf("%s: no <!-- %s --> ... %s block", path, name, end)
	}
	var next bytes.Buffer
	next.Write(b[:i+len(begin)])
	next.WriteString(body)
	next.Write(b[j:])
	return os.WriteFile(path, next.Bytes(), 0o644)
}
