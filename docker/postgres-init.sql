-- MLflow's backend store lives beside Airflow's metadata DB on the same server.
CREATE DATABASE mlflow OWNER airflow;
