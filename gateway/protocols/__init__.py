"""Request bodies of the gateway's KServe and Cluster Serving routes (EAS bodies: eas_sdk.codecs.eas)."""
