package main

import (
	"fmt"
	"os"
	"path/filepath"

	apimanifests "github.com/operator-framework/api/pkg/manifests"
	apivalidation "github.com/operator-framework/api/pkg/validation"
	apierrors "github.com/operator-framework/api/pkg/validation/errors"
	interfaces "github.com/operator-framework/api/pkg/validation/interfaces"
	registrybundle "github.com/operator-framework/operator-registry/pkg/lib/bundle"
	"github.com/sirupsen/logrus"
	k8svalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The optional validators operator-sdk v1.42.0 labels suite=operatorframework.
var operatorFramework = []interfaces.Validator{
	apivalidation.OperatorHubV2Validator,
	apivalidation.StandardCapabilitiesValidator,
	apivalidation.StandardCategoriesValidator,
	apivalidation.AlphaDeprecatedAPIsValidator,
	apivalidation.GoodPracticesValidator,
}

// validate checks an OLM registry+v1 bundle directory the way
// `operator-sdk bundle validate DIR --select-optional suite=operatorframework` (operator-sdk
// v1.42.0, internal/cmd/operator-sdk/bundle/validate) does, with the same libraries at the same
// versions: operator-registry's format check (annotations, directories, media type), the
// bundle-content validators of operator-framework/api (bundle, ClusterServiceVersion, CRDs,
// object metadata), and the optional suite `operatorframework` (operatorhubv2, capabilities,
// categories, alpha-deprecated-apis, good-practices).
//
// It prints one line per error or warning and exits 1 when there is an error, 2 when the
// bundle cannot be read.

func validate(dir string) {
	logger := logrus.NewEntry(logrus.New())
	var results []apierrors.ManifestResult
	format := apierrors.ManifestResult{Name: "bundle format"}
	// The format check reads only the directory; the registry is for unpacking images.
	if err := registrybundle.NewImageValidator(nil, logger).ValidateBundleFormat(dir); err != nil {
		format.Add(apierrors.ErrInvalidBundle(err.Error(), dir))
	}
	results = append(results, format)

	manifests := filepath.Join(dir, registrybundle.ManifestsDir)
	mediaType, err := registrybundle.GetMediaType(manifests)
	if err != nil {
		fail(err)
	}
	if mediaType != registrybundle.RegistryV1Type {
		fail(fmt.Errorf("media type %s, expected %s", mediaType, registrybundle.RegistryV1Type))
	}
	bundle, err := apimanifests.GetBundleFromDir(manifests)
	if err != nil {
		fail(err)
	}
	results = append(results, content(bundle)...)
	for _, validator := range operatorFramework {
		results = append(results, validator.Validate(bundle)...)
	}

	errors := 0
	for _, result := range results {
		for _, e := range result.Errors {
			errors++
			fmt.Printf("ERROR %s: %s\n", result.Name, e.Error())
		}
		for _, w := range result.Warnings {
			fmt.Printf("WARNING %s: %s\n", result.Name, w.Error())
		}
	}
	if errors > 0 {
		os.Exit(1)
	}
	fmt.Println("All validation tests have completed successfully")
}

// content is operator-sdk's ValidateBundleContent for registry+v1: every object a kind the
// format supports with valid metadata, then the bundle, its CSV and its CRDs.
func content(bundle *apimanifests.Bundle) []apierrors.ManifestResult {
	objects := apierrors.ManifestResult{Name: bundle.Name}
	for _, u := range bundle.Objects {
		gvk := u.GetObjectKind().GroupVersionKind()
		if gvk.Kind == "ClusterServiceVersion" || gvk.Kind == "CustomResourceDefinition" {
			continue
		}
		if supported, _ := registrybundle.IsSupported(gvk.Kind); !supported {
			objects.Add(apierrors.ErrInvalidBundle("unsupported kind for a registry+v1 bundle object", gvk))
			continue
		}
		noName := func(string, bool) []string { return nil }
		meta := k8svalidation.ValidateObjectMetaAccessor(metav1.Object(u), false, noName, field.NewPath("metadata"))
		if len(meta) > 0 {
			objects.Add(apierrors.ErrFailedValidation(meta.ToAggregate().Error(), u.GetName()))
		}
	}
	results := apivalidation.BundleValidator.Validate(bundle)
	if bundle.CSV != nil {
		results = append(results, apivalidation.ClusterServiceVersionValidator.Validate(bundle.CSV)...)
	} else {
		objects.Add(apierrors.ErrInvalidBundle("no ClusterServiceVersion in bundle", bundle.Name))
	}
	var crds []interface{}
	for _, crd := range bundle.V1beta1CRDs {
		crds = append(crds, crd)
	}
	for _, crd := range bundle.V1CRDs {
		crds = append(crds, crd)
	}
	if len(crds) != 0 {
		results = append(results, apivalidation.CustomResourceDefinitionValidator.Validate(crds...)...)
	}
	return append(results, objects)
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "ERROR reading the bundle: %v\n", err)
	os.Exit(2)
}
