package fingerprint_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/nodelane/nodelane/fingerprint"
)

// Two replicas share a database; the second was given another pepper.
func ExampleCheck() {
	ctx := context.Background()
	db := fingerprint.NewMemoryStore() // bunstore's FingerprintStore in production
	const verifierKey = "nodelane.example/receipts+4f0c8a1e+AeAMDUV2bfnf3u3eDthyRBR2ux9ypdU4bzvBzqpjMj3T"

	first := []fingerprint.Fingerprint{fingerprint.Pepper(1, bytes.Repeat([]byte{1}, 32)), fingerprint.ReceiptKey(verifierKey)}
	if _, err := fingerprint.Check(ctx, db, first); err != nil {
		fmt.Println(err)
	}
	second := []fingerprint.Fingerprint{fingerprint.Pepper(1, bytes.Repeat([]byte{2}, 32)), fingerprint.ReceiptKey(verifierKey)}
	_, err := fingerprint.Check(ctx, db, second)
	var me *fingerprint.MismatchError
	fmt.Println(errors.Is(err, fingerprint.ErrMismatch), errors.As(err, &me) && me.Mismatches[0].Kind == fingerprint.KindPepper)
	fmt.Println(err)
	// Output:
	// true true
	// secrets differ from the database's (another replica's secrets file?): credential pepper 1 (fingerprint 3a7bac1e3cc2c12d here, fc56f5617e65fa1e in the database)
}
